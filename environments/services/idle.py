"""The idle rule applied (environments.idle_rule decides): beat's pass over active
environments, the warning, the stop and "keep running"; and the deletion of environments
stopped longer than their policy's `delete_after_stopped_days`."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.urls import reverse
from django.utils import timezone

from console.models import User
from console.service_errors import ErrorCode, ServiceError
from console.services.notifications import notify
from environments import selectors
from environments.idle_rule import IdleDecision, IdleStep, idle_decide
from environments.models import Environment, EnvironmentStatus
from environments.services.lifecycle import (
    KEEP_ALIVE_MAX_MINUTES,
    check_may_use,
    environment_delete,
    environment_stop,
    environment_sync,
    idle_policy_validate,
    when,
)
from jobs.actors import SYSTEM
from jobs.models import JobStatus
from jobs.state import job_note

logger = logging.getLogger(__name__)
# Stopped environments the policy deletes: their owner is told this long before.
DELETION_NOTICE = timedelta(days=1)


def environments_sync_active() -> int:
    """Sync every environment whose job may still change and apply the idle rule to the
    running ones (beat's pass, every 10 s); how many."""
    active = Environment.objects.exclude(
        status__in=[EnvironmentStatus.STOPPED, EnvironmentStatus.FAILED]
    ).select_related("tenant", "current_job", "created_by")
    count = 0
    for environment in active:
        environment_sync(environment=environment)
        environment_idle_check(environment=environment)
        count += 1
    return count


def _tell_owner(environment: Environment, *, title: str, body: str, level: str) -> None:
    notify(
        tenant=environment.tenant, user=environment.created_by, title=title, body=body,
        url=reverse("environments:detail", kwargs={"name": environment.name}), level=level,
    )  # fmt: skip


def environment_idle_check(*, environment: Environment, now=None) -> IdleDecision | None:
    """Apply the idle rule to a running environment: warn (banner, notification) before
    the stop, stop it (the home volume stays), or, on activity after a warning, carry on.
    Every step goes on its job's timeline with the readings that caused it. None: it
    isn't running."""
    now = now or timezone.now()
    job = environment.current_job
    if job is None or job.status != JobStatus.RUNNING:
        return None
    policy = idle_policy_validate(environment.idle_policy)  # an older row: defaults
    decision = idle_decide(
        selectors.environment_activities(environment=environment, policy=policy, now=now),
        idle_minutes=policy["idle_minutes"],
        warning_minutes=policy["warning_minutes"],
        now=now,
    )
    name = environment.name
    if decision.step is IdleStep.STOP:
        reason = (
            f"idle for {policy['idle_minutes']} min, stopped by its idle policy (the home "
            f"volume stays) — {decision.readings}"
        )
        try:
            environment_stop(environment=environment, user=None, reason=reason)
        except ServiceError:  # stopped meanwhile
            return decision
        _tell_owner(
            environment, title=f"Environment {name} stopped: idle", level="warning",
            body=f"Every activity source was idle for {policy['idle_minutes']} min "
            f"({decision.readings}). Its home volume and files stay; start it again any time.",
        )  # fmt: skip
    elif decision.step is IdleStep.WARN and environment.idle_stop_at is None:
        warned = Environment.objects.filter(pk=environment.pk, idle_stop_at__isnull=True)
        if warned.update(idle_stop_at=decision.stop_at):
            environment.idle_stop_at = decision.stop_at
            job_note(
                job=job, actor=SYSTEM,
                reason=f"Environment idle since {when(decision.idle_since)}: stops at "
                f"{when(decision.stop_at)} unless there is activity — {decision.readings}",
            )  # fmt: skip
            _tell_owner(
                environment, title=f"Environment {name} stops at {when(decision.stop_at)}",
                level="warning",
                body=f"It has been idle since {when(decision.idle_since)} "
                f"({decision.readings}). Use it, or press Keep running on its page.",
            )  # fmt: skip
            environment_sync(environment=environment)
    elif decision.step is IdleStep.ACTIVE and environment.idle_stop_at is not None:
        Environment.objects.filter(pk=environment.pk).update(idle_stop_at=None)
        environment.idle_stop_at = None
        job_note(
            job=job, actor=SYSTEM,
            reason=f"Environment active again, not stopping — {decision.readings}",
        )  # fmt: skip
        environment_sync(environment=environment)
    return decision


def environment_keep_alive(
    *, environment: Environment, user: User | None, minutes: int = 0
) -> Environment:
    """Count as activity now, or until `minutes` from now (a warning's "Keep running",
    `gpugeek keep-alive`); 409 when it isn't running."""
    check_may_use(environment, user)
    if isinstance(minutes, bool) or not isinstance(minutes, int):
        raise ServiceError("minutes is a whole number.", field="minutes")
    if not 0 <= minutes <= KEEP_ALIVE_MAX_MINUTES:
        raise ServiceError(
            f"Keep it running for 0 to {KEEP_ALIVE_MAX_MINUTES} minutes.", field="minutes"
        )
    environment_sync(environment=environment)
    if environment.status not in (EnvironmentStatus.RUNNING, EnvironmentStatus.IDLE_WARNING):
        raise ServiceError(
            f"Environment {environment.name} isn't running "
            f"({environment.get_status_display().lower()}).",
            code=ErrorCode.CONFLICT,
        )
    until = timezone.now() + timedelta(minutes=minutes)
    if environment.keep_alive_until is None or environment.keep_alive_until < until:
        environment.keep_alive_until = until
        Environment.objects.filter(pk=environment.pk).update(keep_alive_until=until)
    environment_idle_check(environment=environment)  # a warning ends now, not in 10 s
    return environment_sync(environment=environment)


def environment_ssh_activity(*, environment_id: int) -> None:
    """An SSH connection through the gateway is still open: activity (every minute)."""
    Environment.objects.filter(pk=environment_id).update(last_activity_at=timezone.now())


def environments_delete_long_stopped(*, now: datetime | None = None) -> int:
    """Delete the environments stopped (or failed) longer than their policy's
    `delete_after_stopped_days`, with their home volume: that is the policy's point, as a
    stopped environment pays only for its volumes. Its creator is told a day before,
    and a start meanwhile keeps it. Beat's hourly pass; how many were deleted."""
    now = now or timezone.now()
    settled = Environment.objects.filter(
        status__in=[EnvironmentStatus.STOPPED, EnvironmentStatus.FAILED]
    ).select_related("tenant", "current_job", "created_by", "home_volume")
    deleted = 0
    for environment in settled:
        delete_at = selectors.environment_deletion_at(environment)
        if delete_at is None:
            continue
        environment_sync(environment=environment)
        if environment.active:
            continue
        days = environment.idle_policy["delete_after_stopped_days"]
        if now >= delete_at - DELETION_NOTICE and environment.deletion_noticed_at is None:
            noticed = Environment.objects.filter(pk=environment.pk, deletion_noticed_at=None)
            if noticed.update(deletion_noticed_at=now):
                environment.deletion_noticed_at = now
                on = max(delete_at, now + DELETION_NOTICE)
                _tell_owner(
                    environment, level="warning",
                    title=f"Environment {environment.name} is deleted on {when(on)}",
                    body=f"It has been stopped since {when(delete_at - timedelta(days=days))}; "
                    f"its idle policy deletes it and its home volume "
                    f"{environment.home_volume.name} (with every file on it) after {days} "
                    "days stopped. Start it, or change its idle policy, to keep it.",
                )  # fmt: skip
            continue  # deleted a day after the notice at the earliest
        noticed_at = environment.deletion_noticed_at
        if now < delete_at or noticed_at is None or now < noticed_at + DELETION_NOTICE:
            continue
        try:
            environment_delete(environment=environment, user=None, keep_volume=False)
        except ServiceError as error:  # e.g. another job mounts the volume: next pass
            logger.info("environment %s not deleted yet: %s", environment.pk, error.message)
            continue
        _tell_owner(
            environment, level="info", title=f"Environment {environment.name} deleted",
            body=f"Stopped for {days} days, it was deleted with its home volume "
            f"{environment.home_volume.name}, as its idle policy says.",
        )  # fmt: skip
        deleted += 1
    return deleted
