"""The job state machine: the only code that changes Job.status.

Every change is checked against TRANSITIONS, recorded as a JobEvent (time, actor, reason)
and published to the job's and tenant's live channels after commit.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from console.services import ServiceError
from jobs import realtime
from jobs.models import FINISHED, Job, JobEvent, JobStatus
from jobs.notifications import job_status_notify

S = JobStatus
TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.DISPATCHING, S.CANCELLED, S.FAILED}),
    S.DISPATCHING: frozenset(
        {S.PROVISIONING, S.RUNNING, S.FAILED, S.CANCELLED, S.QUEUED, S.SUCCEEDED}
    ),
    S.PROVISIONING: frozenset(
        {S.RUNNING, S.FAILED, S.CANCELLED, S.PREEMPTED, S.PAUSING, S.SUCCEEDED}
    ),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PAUSING, S.PREEMPTED}),
    S.PAUSING: frozenset({S.PAUSED, S.FAILED, S.CANCELLED, S.SUCCEEDED}),
    S.PAUSED: frozenset({S.RESUMING, S.CANCELLED}),
    S.RESUMING: frozenset(
        {S.PROVISIONING, S.RUNNING, S.FAILED, S.CANCELLED, S.SUCCEEDED, S.PREEMPTED}
    ),
    S.PREEMPTED: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


class IllegalTransition(ServiceError):
    """Refused change; a ServiceError so the API answers 409 with the message."""

    def __init__(self, job: Job, to: str):
        self.job, self.to = job, to
        super().__init__(
            f"A {job.get_status_display().lower()} job can't become {to}.", code="conflict"
        )


def can_transition(current: str, to: str) -> bool:
    return to in TRANSITIONS.get(current, frozenset())


@transaction.atomic
def job_transition(
    *,
    job: Job,
    to: str,
    actor: str,
    reason: str = "",
    expected_from: frozenset[str] | None = None,
    **changes,
) -> Job:
    """Move `job` to `to`. The row is locked and re-read, so two racing callers can't both
    apply a change; `expected_from` lets a caller act only from given statuses."""
    locked = Job.objects.select_for_update().get(pk=job.pk)
    if expected_from is not None and locked.status not in expected_from:
        raise IllegalTransition(locked, to)
    if not can_transition(locked.status, to):
        raise IllegalTransition(locked, to)
    now = timezone.now()
    previous = locked.status
    locked.status = to
    locked.status_reason = reason[:500]
    locked.status_changed_at = now
    if to == S.RUNNING and locked.started_at is None:
        locked.started_at = now
    if to in FINISHED:
        locked.finished_at = now
    for field, value in changes.items():
        setattr(locked, field, value)
    locked.save()
    JobEvent.objects.create(
        job=locked,
        at=now,
        from_status=previous,
        to_status=to,
        actor=actor,
        reason=reason[:1000],
        attempt=locked.attempt,
    )
    realtime.publish_job_status(locked)
    job_status_notify(locked, to, actor, reason)
    # Keep the caller's instance current too.
    for field in (
        "status",
        "status_reason",
        "status_changed_at",
        "started_at",
        "finished_at",
        *changes,
    ):
        setattr(job, field, getattr(locked, field))
    return locked


def job_note(*, job: Job, actor: str, reason: str) -> None:
    """A timeline entry without a status change (e.g. a backend event, a retry)."""
    JobEvent.objects.create(
        job=job,
        from_status=job.status,
        to_status=job.status,
        actor=actor,
        reason=reason[:1000],
        attempt=job.attempt,
    )


def job_reason_update(*, job: Job, reason: str) -> Job:
    """Say why a job is still where it is (e.g. what it waits for) without a status
    change: no timeline entry, but the live page and list see it."""
    reason = reason[:500]
    if job.status_reason != reason:
        Job.objects.filter(pk=job.pk, status=job.status).update(status_reason=reason)
        job.status_reason = reason
        realtime.publish_job_status(job)
    return job
