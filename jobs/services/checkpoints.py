"""Checkpoints of jobs: recording the newest, where a new start continues from, and
pruning old ones.

A start that continues a job's work (a requeued attempt after preemption, a resume after
a pause) is prepared here just before its backend call: the latest complete checkpoint
under the job's prefix becomes `Job.resume_from` (GPUGEEK_RESUME_FROM), and a `JobResume`
row plus a timeline entry record it with the work lost since that checkpoint. Preparing
is idempotent per (attempt, start), so a redelivered dispatch starts from the same one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from console.models import Tenant
from console.service_errors import ErrorCode, ServiceError
from jobs.actors import SYSTEM
from jobs.checkpoints.events import (
    checkpoint_event_job,
    checkpoint_event_retry_after,
    checkpoint_event_turn,
)
from jobs.checkpoints.store import (
    MANIFEST_NAME,
    Checkpoint,
    S3CheckpointStore,
    checkpoint_store,
    job_prefix,
)
from jobs.models import Job, JobEvent, JobResume, JobStatus
from jobs.state import job_note

log = logging.getLogger(__name__)


def job_store_prefix(job: Job) -> str:
    return job_prefix(tenant_id=job.tenant_id, job_id=job.pk)


def _interrupted_at(job: Job):
    """When the work this start continues was interrupted: the last preemption or pause."""
    event = (
        JobEvent.objects.filter(job=job, to_status__in=[JobStatus.PREEMPTED, JobStatus.PAUSING])
        .order_by("-at", "-id")
        .first()
    )
    return event.at if event else None


def _describe(resume: JobResume) -> str:
    if resume.step is None:
        return "no complete checkpoint: starting from the beginning"
    text = f"resumed from checkpoint step {resume.step}"
    if resume.attempt == 1 and resume.start == 0 and resume.job.checkpoint_source_id:
        text += f" (a copy of job #{resume.job.checkpoint_source_id}'s)"
    if resume.lost_seconds is not None:
        text += f"; {resume.lost_seconds / 60:.1f} min of work lost since it"
    return text


def _copy_source_checkpoint(job: Job) -> None:
    """A clone from a checkpoint gets a copy of its source's latest one in its own prefix
    (server-side on S3), so that it never needs to reach outside that prefix."""
    source = (
        Job.objects.for_tenant(job.tenant).filter(pk=job.checkpoint_source_id).first()
        if job.checkpoint_source_id is not None
        else None
    )
    if source is None:
        return
    store = checkpoint_store()
    latest = store.latest(job_store_prefix(source))
    if latest is not None:
        step = f"{latest.step}/"
        store.copy_prefix(job_store_prefix(source) + step, job_store_prefix(job) + step)


def job_resume_prepare(*, job: Job, start: int) -> JobResume:
    """Decide (once) what start `start` of the job's current attempt continues from.

    Reads the store (may raise its errors: the caller retries the start later)."""
    existing = JobResume.objects.filter(job=job, attempt=job.attempt, start=start).first()
    if existing is not None:
        job.resume_from = existing.manifest_key
        return existing
    if job.attempt == 1 and start == 0 and job.checkpoint_source_id:
        _copy_source_checkpoint(job)
    latest: Checkpoint | None = checkpoint_store().latest(job_store_prefix(job))
    interrupted = _interrupted_at(job)
    lost = None
    if latest is not None and interrupted is not None:
        lost = max(0.0, (interrupted - latest.time).total_seconds())
    with transaction.atomic():
        resume, created = JobResume.objects.get_or_create(
            job=job,
            attempt=job.attempt,
            start=start,
            defaults={
                "at": timezone.now(),
                "manifest_key": latest.manifest_key if latest else "",
                "step": latest.step if latest else None,
                "checkpoint_at": latest.time if latest else None,
                "lost_seconds": lost,
            },
        )
        Job.objects.filter(pk=job.pk).update(resume_from=resume.manifest_key)
        job.resume_from = resume.manifest_key
        if created:
            job_note(job=job, actor=SYSTEM, reason=_describe(resume))
    return resume


def job_keep_last(job: Job) -> int:
    """How many complete checkpoints the job keeps: its spec's, else the installation's."""
    if job.checkpoint_keep_last is not None:
        return job.checkpoint_keep_last
    return settings.CHECKPOINT_KEEP_LAST


@dataclass(frozen=True)
class CheckpointRecord:
    latest: Checkpoint | None  # the newest complete checkpoint, now recorded
    pruned: list[int]  # steps deleted


def job_checkpoint_record(*, job: Job, keep_last: int | None = None) -> CheckpointRecord:
    """Record the job's newest complete checkpoint and prune the older ones beyond its
    `keep_last`, at once (the job's `checkpoint` event) or at the periodic scan.

    The store is listed here: whatever the event said, only a checkpoint the console
    finds complete counts. The recorded step only moves forward (two events racing
    record the newer). Reads the store (may raise its errors)."""
    complete = checkpoint_store().checkpoints(job_store_prefix(job))
    latest = complete[-1] if complete else None
    if latest is not None and latest.step != job.last_checkpoint_step:
        newer = Q(last_checkpoint_step__isnull=True) | Q(last_checkpoint_step__lt=latest.step)
        Job.objects.filter(newer, pk=job.pk).update(
            last_checkpoint_step=latest.step, last_checkpoint_at=latest.time
        )
        job.last_checkpoint_step, job.last_checkpoint_at = latest.step, latest.time
    pruned = job_checkpoints_prune(job=job, keep_last=keep_last, complete=complete)
    return CheckpointRecord(latest=latest, pruned=pruned)


def job_checkpoints_prune(
    *, job: Job, keep_last: int | None = None, complete: list[Checkpoint] | None = None
) -> list[int]:
    """Delete the job's complete checkpoints beyond the newest `keep_last` (default: the
    job's own, else CHECKPOINT_KEEP_LAST), never the one its current start resumed from,
    and unfinished uploads older than the oldest kept. `complete`: the listing the caller
    just made. Returns the steps deleted."""
    keep_last = job_keep_last(job) if keep_last is None else keep_last
    store = checkpoint_store()
    prefix = job_store_prefix(job)
    if complete is None:
        complete = store.checkpoints(prefix)
    if len(complete) <= keep_last:
        return []
    kept = complete[len(complete) - keep_last :] if keep_last > 0 else []
    oldest_kept = kept[0].step if kept else None
    in_use = job.resume_from
    deleted = []
    for checkpoint in complete:
        if checkpoint in kept or checkpoint.manifest_key == in_use:
            continue
        store.delete_checkpoint(prefix, checkpoint.step)
        deleted.append(checkpoint.step)
    if oldest_kept is not None:
        complete_steps = {checkpoint.step for checkpoint in complete}
        partial = {
            int(key.split("/", 1)[0])
            for key in store.sizes(prefix)
            if key.split("/", 1)[0].isdigit() and not key.endswith(f"/{MANIFEST_NAME}")
        } - complete_steps
        for step in sorted(partial):
            if step < oldest_kept and f"{step}/{MANIFEST_NAME}" != in_use:
                store.delete_prefix(f"{prefix}{step}/")
                deleted.append(step)
    return sorted(deleted)


def jobs_checkpoints_prune(*, keep_last: int | None = None) -> int:
    """The periodic scan: record the newest checkpoint of, and prune, every job that may
    still be writing or may resume (running, paused, queued again); the jobs' own events
    do it sooner. A store error skips that job until the next pass."""
    pruned = 0
    active = [
        JobStatus.RUNNING,
        JobStatus.PROVISIONING,
        JobStatus.RESUMING,
        JobStatus.PAUSING,
        JobStatus.PAUSED,
        JobStatus.QUEUED,
        JobStatus.DISPATCHING,
    ]
    columns = ("pk", "tenant_id", "resume_from", "checkpoint_keep_last", "last_checkpoint_step")
    for job in Job.objects.filter(status__in=active).only(*columns):
        try:
            pruned += len(job_checkpoint_record(job=job, keep_last=keep_last).pruned)
        except Exception:  # one store error must not stop the pass for other jobs
            log.exception("pruning the checkpoints of job %s failed", job.pk)
    return pruned


def _job_of_token(*, token: str, job_id: int) -> Job:
    """The active job a job token was made for (see jobs.checkpoints.events): 404 when the
    token isn't that job's, 409 once the job has finished (its token no longer counts)."""
    owner = checkpoint_event_job(token)
    if owner is None or owner[1] != job_id:
        # 404 as for every credential that doesn't reach a job: whether it exists stays unsaid.
        raise ServiceError("No such job for this checkpoint token.", code=ErrorCode.NOT_FOUND)
    tenant = Tenant.objects.filter(pk=owner[0]).first()
    job = Job.objects.for_tenant(tenant).filter(pk=job_id).first()
    if job is None:
        raise ServiceError("No such job.", code=ErrorCode.NOT_FOUND)
    if job.is_finished:
        raise ServiceError("The job has finished.", code=ErrorCode.CONFLICT)
    return job


def job_checkpoint_event(*, token: str, job_id: int) -> CheckpointRecord:
    """A job's `checkpoint` event: the console records and prunes as at its scan. A
    finished job's last checkpoint is found by the scan that ran while it was active, or
    at its next resume."""
    job = _job_of_token(token=token, job_id=job_id)
    _checkpoint_event_take_turn(job)
    return job_checkpoint_record(job=job)


def job_checkpoint_credentials(*, token: str, job_id: int) -> dict[str, str]:
    """Renewed temporary store credentials for a job that is not finished, limited to its
    own prefix (AccessKeyId, SecretAccessKey, Token, Expiration). Served from the store's
    cache, so a job asking often costs no STS call; 409 when the store hands jobs no
    temporary credentials (theirs don't expire)."""
    job = _job_of_token(token=token, job_id=job_id)
    store = checkpoint_store()
    if not isinstance(store, S3CheckpointStore) or not store.issues_temporary_credentials:
        raise ServiceError(
            "This installation's checkpoint store gives jobs no temporary credentials; "
            "a job's store credentials don't expire.",
            code=ErrorCode.CONFLICT,
        )
    return store.job_temporary_credentials(job_store_prefix(job))


class CheckpointEventTooSoon(Exception):
    """The job posts events faster than their rate; `retry_after` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"retry in {retry_after:.1f} s")
        self.retry_after = retry_after


def _checkpoint_event_take_turn(job: Job) -> None:
    """Count the event against the job's rate (under the row's lock: events racing are
    counted one after another), or CheckpointEventTooSoon."""
    now = timezone.now()
    with transaction.atomic():
        due_at = (
            Job.objects.select_for_update()
            .values_list("checkpoint_event_due_at", flat=True)
            .get(pk=job.pk)
        )
        next_due = checkpoint_event_turn(due_at=due_at, now=now)
        if next_due is None:
            assert due_at is not None
            raise CheckpointEventTooSoon(checkpoint_event_retry_after(due_at=due_at, now=now))
        Job.objects.filter(pk=job.pk).update(checkpoint_event_due_at=next_due)
