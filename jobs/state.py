"""The job state machine: the only code that changes Job.status.

Every change is checked against TRANSITIONS, recorded as a JobEvent (time, actor, reason)
and published to the job's and tenant's live channels after commit.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from console.service_errors import ErrorCode, ServiceError
from jobs import realtime
from jobs.actors import Actor
from jobs.models import FINISHED, Job, JobEvent, JobStatus, WaitKind
from jobs.notifications import job_status_notify

# A cancel of a job whose work may run on its backend goes through `cancelling` (still
# holding and billing its compute) until the backend reports the work ended; one that
# runs nothing (queued, dispatching, paused, preempted) is `cancelled` at once.
TRANSITIONS: dict[str, frozenset[str]] = {
    JobStatus.QUEUED: frozenset({JobStatus.DISPATCHING, JobStatus.CANCELLED, JobStatus.FAILED}),
    JobStatus.DISPATCHING: frozenset(
        {
            JobStatus.PROVISIONING,
            JobStatus.RUNNING,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.QUEUED,
            JobStatus.SUCCEEDED,
        }
    ),
    JobStatus.PROVISIONING: frozenset(
        {
            JobStatus.RUNNING,
            JobStatus.FAILED,
            JobStatus.CANCELLING,
            JobStatus.PREEMPTED,
            JobStatus.PAUSING,
            JobStatus.SUCCEEDED,
        }
    ),
    JobStatus.RUNNING: frozenset(
        {
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.CANCELLING,
            JobStatus.PAUSING,
            JobStatus.PREEMPTED,
        }
    ),
    JobStatus.PAUSING: frozenset(
        {JobStatus.PAUSED, JobStatus.FAILED, JobStatus.CANCELLING, JobStatus.SUCCEEDED}
    ),
    JobStatus.PAUSED: frozenset({JobStatus.RESUMING, JobStatus.CANCELLED}),
    JobStatus.RESUMING: frozenset(
        {
            JobStatus.PROVISIONING,
            JobStatus.RUNNING,
            JobStatus.FAILED,
            JobStatus.CANCELLING,
            JobStatus.SUCCEEDED,
            JobStatus.PREEMPTED,
        }
    ),
    JobStatus.CANCELLING: frozenset({JobStatus.CANCELLED}),
    JobStatus.PREEMPTED: frozenset({JobStatus.QUEUED, JobStatus.CANCELLED, JobStatus.FAILED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


class IllegalTransition(ServiceError):
    """Refused change; a ServiceError so the API answers 409 with the message."""

    def __init__(self, job: Job, to: str):
        self.job, self.to = job, to
        super().__init__(
            f"A {job.get_status_display().lower()} job can't become {to}.", code=ErrorCode.CONFLICT
        )


def can_transition(current: str, to: str) -> bool:
    return to in TRANSITIONS.get(current, frozenset())


def job_transition(
    *,
    job: Job,
    to: str,
    actor: Actor,
    reason: str = "",
    expected_from: frozenset[str] | None = None,
    **changes,
) -> Job:
    """Move `job` to `to`. The row is locked and re-read, so two racing callers can't both
    apply a change; `expected_from` lets a caller act only from given statuses."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        return _transition(locked, job, to, actor, reason, expected_from, changes)


def job_transition_held(*, job: Job, to: str, actor: Actor, reason: str = "") -> Job:
    """`job_transition` of a row the caller's transaction holds and has current (it
    inserted it: a launch admitted in its own transaction), without the re-read."""
    return _transition(job, job, to, actor, reason, None, {})


# What a transition writes besides the caller's `changes`.
TRANSITION_FIELDS = (
    "status",
    "status_reason",
    "status_changed_at",
    "started_at",
    "finished_at",
    "wait_kind",
    "run_seconds",
    "running_since",
    "dispatch_claimed_by",
    "dispatch_claimed_until",
    "dispatch_after",
)


def _transition(
    locked: Job,
    job: Job,
    to: str,
    actor: Actor,
    reason: str,
    expected_from: frozenset[str] | None,
    changes: dict,
) -> Job:
    if not _allowed(locked, to, expected_from):
        raise IllegalTransition(locked, to)
    event = _apply(locked, to, actor, reason, changes)
    locked.save(update_fields=[*TRANSITION_FIELDS, *changes])
    event.save()
    realtime.publish_job_status(locked)
    job_status_notify(locked, to, actor, reason, previous=event.from_status)
    # Keep the caller's instance current too.
    for field in (*TRANSITION_FIELDS, *changes):
        setattr(job, field, getattr(locked, field))
    return locked


def _allowed(locked: Job, to: str, expected_from: frozenset[str] | None) -> bool:
    if expected_from is not None and locked.status not in expected_from:
        return False
    return can_transition(locked.status, to)


def _apply(
    locked: Job, to: str, actor: Actor, reason: str, changes: dict, now: datetime | None = None
) -> JobEvent:
    """Set the new status and what follows from it on `locked` (not saved); returns its
    timeline entry (not saved)."""
    now = now or timezone.now()
    previous = locked.status
    locked.status = to
    locked.status_reason = reason[:500]
    # A new status starts without a wait unless the caller names one (e.g. requeued).
    locked.wait_kind = changes.pop("wait_kind", WaitKind.NONE)
    locked.status_changed_at = now
    if to == JobStatus.RUNNING and locked.started_at is None:
        locked.started_at = now
    # Running time is what max runtime counts: spans in `running` only.
    if previous == JobStatus.RUNNING and locked.running_since is not None:
        locked.run_seconds += max(0.0, (now - locked.running_since).total_seconds())
        locked.running_since = None
    if to == JobStatus.RUNNING:
        locked.running_since = now
    if to in FINISHED:
        locked.finished_at = now
    if to == JobStatus.DISPATCHING:  # a new start: due at once, for any sweep
        locked.dispatch_claimed_by, locked.dispatch_claimed_until = "", None
        locked.dispatch_after = None
    for field, value in changes.items():
        setattr(locked, field, value)
    return timeline_event(locked, actor=actor, reason=reason, at=now, previous=previous)


def timeline_event(
    job: Job, *, actor: Actor, reason: str, at: datetime, previous: str | None = None
) -> JobEvent:
    """`job`'s timeline entry (not saved) from `previous` (None: no change) to its status."""
    return JobEvent(
        job=job,
        at=at,
        from_status=job.status if previous is None else previous,
        to_status=job.status,
        actor_kind=actor.kind,
        actor_user_id=actor.user_id,
        reason=reason[:1000],
        attempt=job.attempt,
    )


def job_transition_in_past(
    *, job: Job, to: str, actor: Actor, reason: str, at: datetime, **changes
) -> JobEvent:
    """What `job_transition` does to `job`, at the past instant `at`, on an unsaved job:
    the same legality check and fields; returns the timeline entry (not saved). Nothing
    is locked, saved or published: for a history of jobs that ended long ago (the demo
    data), written in bulk by its caller."""
    if not can_transition(job.status, to):
        raise IllegalTransition(job, to)
    return _apply(job, to, actor, reason, changes, at)


def jobs_transition_many(
    *, jobs: list[Job], to: str, actor: Actor, reason: str, expected_from: frozenset[str]
) -> list[Job]:
    """`job_transition` for many jobs in one transaction (a batch dispatch): the rows are
    locked together in pk order and re-read; those no longer in `expected_from` (a racing
    cancel, a duplicate) are left as they are and out of the result. The rest are written
    with one UPDATE per distinct set of new values (one, for a batch coming from one
    status), their events in one INSERT, and published after commit in one send. The
    callers' instances of the moved jobs are kept current."""
    given = {job.pk: job for job in jobs}
    now = timezone.now()
    with transaction.atomic():
        rows = Job.objects.select_for_update().filter(pk__in=list(given)).order_by("pk")
        moved = [row for row in rows if _allowed(row, to, expected_from)]
        events = [_apply(row, to, actor, reason, {}, now) for row in moved]
        if moved:
            # Not bulk_update: its CASE per row and field costs more than the rest together.
            same_values: dict[tuple, list[int]] = defaultdict(list)
            for row in moved:
                same_values[tuple(getattr(row, f) for f in TRANSITION_FIELDS)].append(row.pk)
            for values, pks in same_values.items():
                Job.objects.filter(pk__in=pks).update(
                    **dict(zip(TRANSITION_FIELDS, values, strict=True))
                )
            JobEvent.objects.bulk_create(events)
            realtime.publish_jobs_status(moved)
            for row, event in zip(moved, events, strict=True):
                job_status_notify(row, to, actor, reason, previous=event.from_status)
    for row in moved:
        for field in TRANSITION_FIELDS:
            setattr(given[row.pk], field, getattr(row, field))
    return moved


def job_run_seconds(job: Job, now: datetime) -> float:
    """Seconds `job` has spent running, over all its attempts, as of `now`."""
    since = job.running_since
    if since is None and job.status == JobStatus.RUNNING:
        since = job.status_changed_at  # running since before running_since was kept
    current = (now - since).total_seconds() if since else 0.0
    return job.run_seconds + max(0.0, current)


def job_note(*, job: Job, actor: Actor, reason: str) -> None:
    """A timeline entry without a status change (e.g. a backend event, a retry)."""
    timeline_event(job, actor=actor, reason=reason, at=timezone.now()).save()


def job_wait_update(*, job: Job, kind: str, reason: str) -> Job:
    """Say what a job that isn't running yet waits for, and why in words, without a
    status change: no timeline entry, but the live page and list see it. Only applies
    while the job still has the status the caller read."""
    reason = reason[:500]
    if job.status_reason != reason or job.wait_kind != kind:
        Job.objects.filter(pk=job.pk, status=job.status).update(
            status_reason=reason, wait_kind=kind
        )
        job.status_reason, job.wait_kind = reason, kind
        realtime.publish_job_status(job)
    return job


def job_retry_note(*, job: Job, reason: str) -> Job:
    """A backend call failed and is being retried: the reason says so, and touching
    status_changed_at tells the reconciler a retry is under way (not a lost task)."""
    now = timezone.now()
    reason = reason[:500]
    Job.objects.filter(pk=job.pk, status=job.status).update(
        status_reason=reason, wait_kind=WaitKind.RETRY, status_changed_at=now
    )
    job.status_reason, job.wait_kind, job.status_changed_at = reason, WaitKind.RETRY, now
    realtime.publish_job_status(job)
    return job
