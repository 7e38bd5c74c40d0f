"""Dispatch: start admitted jobs' attempts (or resumed ones) on their backend. The job
row is the queue: admission moves jobs to `dispatching`, and one Celery task
(`jobs.tasks.jobs_dispatch_task`, a sweep) claims those rows in batches and starts them.
Safe to run twice.

Invariants:
- Every route to a start is the sweep: a launch admitted at once, a pass that freed
  capacity for a backlog, a retry, the reconciler. A sweep claims its rows (`_claim`:
  `FOR UPDATE SKIP LOCKED` on PostgreSQL), so two sweeps never start one job; a claim
  outlives a dead worker by DISPATCH_CLAIM_SECONDS at most, and the redelivery of the
  same task takes its own claims again at once.
- A cancel that lands while the backend call runs never leaves work running: the status
  change after the call re-reads the job under its row lock (`jobs_transition_many`), and a
  job cancelled (or failed) meanwhile has what this call started undone.
- An unavailable backend or an unexpected error waits (`Job.dispatch_after`, with a
  back-off) for a later sweep; unexpected errors are counted (`Job.dispatch_failures`) and
  at DISPATCH_MAX_ATTEMPTS the job fails with the error, so it never holds capacity forever.
- Two dispatches on one backend never hand out the same GPU device (`_assign_devices`).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
import zlib
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from console.queueing import enqueue_now, enqueue_on_commit
from jobs import tasks
from jobs.actors import SYSTEM, Actor
from jobs.backends import BackendRejected, BackendUnavailable, ComputeBackend, get_backend
from jobs.models import Job, JobStatus, WaitKind
from jobs.prometheus import dispatch_latency_observe
from jobs.services.checkpoints import job_resume_prepare
from jobs.state import IllegalTransition, job_retry_note, job_transition, jobs_transition_many

log = logging.getLogger(__name__)
# Statuses a racing action may have ended the job in while its backend call ran; what
# the call started must then be undone.
UNDO_AFTER = frozenset({JobStatus.CANCELLING, JobStatus.CANCELLED, JobStatus.FAILED})
# A sweep queued but not started keeps later admissions from queueing another, for at
# most this long (if its worker died with it, the admissions after that queue another).
SWEEP_QUEUED_KEY = "jobs:dispatch:sweep-queued"
SWEEP_QUEUED_SECONDS = 5
# Waits before a failed start is tried again: an unavailable backend, and the first of
# the doubling waits after an unexpected error (at most RETRY_MAX_SECONDS).
RETRY_UNAVAILABLE_SECONDS = 3
RETRY_FIRST_SECONDS = 2
RETRY_MAX_SECONDS = 15


def dispatch_on_commit() -> None:
    """Start the jobs this transaction admitted, once it commits."""
    transaction.on_commit(dispatch_sweep_now)


def dispatch_sweep_now() -> None:
    """Queue a sweep unless one is queued and hasn't started (it will see these rows)."""
    try:
        due = cache.add(SWEEP_QUEUED_KEY, 1, timeout=SWEEP_QUEUED_SECONDS)
    except Exception:  # the cache is the broker's Redis: the send below says the rest
        log.warning("the dispatch sweep mark is unavailable; queueing a sweep anyway")
        due = True
    if due and not enqueue_now(tasks.jobs_dispatch_task):
        with contextlib.suppress(Exception):  # the next admission queues it again
            cache.delete(SWEEP_QUEUED_KEY)


def jobs_dispatch_pending(*, sweep_id: str | None = None) -> int:
    """The sweep: claim `dispatching` rows in batches of DISPATCH_BATCH_SIZE and start
    them, until none is due; first, the rows an earlier delivery of this same task
    claimed. Returns how many it claimed."""
    with contextlib.suppress(Exception):
        cache.delete(SWEEP_QUEUED_KEY)  # admissions from now on queue the next sweep
    sweep_id = sweep_id or uuid.uuid4().hex
    handled, first = 0, True
    while job_ids := _claim(sweep_id, with_own=first):
        jobs_dispatch(job_ids=job_ids)
        handled += len(job_ids)
        first = False
    return handled


def _claim(sweep_id: str, *, with_own: bool) -> list[int]:
    """Claim a batch of due `dispatching` rows for this sweep (in pk order, skipping rows
    another sweep has locked or claimed)."""
    now = timezone.now()
    free = Q(dispatch_claimed_until__isnull=True) | Q(dispatch_claimed_until__lt=now)
    if with_own:
        free |= Q(dispatch_claimed_by=sweep_id)
    due = Q(dispatch_after__isnull=True) | Q(dispatch_after__lte=now)
    with transaction.atomic():
        # SQLite has no row locks (Django leaves the clause out): its writers serialise.
        rows = Job.objects.select_for_update(skip_locked=True).filter(
            free, due, status=JobStatus.DISPATCHING
        )
        batch = rows.order_by("pk").values_list("pk", flat=True)[: settings.DISPATCH_BATCH_SIZE]
        job_ids = list(batch)
        if job_ids:
            until = now + timedelta(seconds=settings.DISPATCH_CLAIM_SECONDS)
            Job.objects.filter(pk__in=job_ids).update(
                dispatch_claimed_by=sweep_id, dispatch_claimed_until=until
            )
    return job_ids


def job_dispatch(*, job: Job) -> Job:
    """Start one admitted job now (what a sweep does for its batch); the job as it is
    afterwards."""
    jobs_dispatch(job_ids=[job.pk])
    job.refresh_from_db()
    return job


def jobs_dispatch(*, job_ids: list[int]) -> list[Job]:
    """Start admitted jobs: one read; on a backend that hands out devices (the local
    host), each job's devices and start in turn; elsewhere the backend's `submit_many`
    (Kubernetes creates their objects concurrently); one transaction moving those
    started. A job whose start fails waits for a later sweep (`_start_failed`), so one
    job's trouble never holds back or repeats the others'. Returns the jobs it started."""
    jobs = Job.objects.with_backend_relations().filter(pk__in=job_ids, status=JobStatus.DISPATCHING)
    by_backend: dict[str, list[Job]] = defaultdict(list)
    for job in jobs.order_by("pk"):
        by_backend[job.backend].append(job)
    started: list[Job] = []
    retry_in: list[float] = []
    for name, jobs_of_backend in by_backend.items():
        backend = get_backend(name)
        group = []
        for job in jobs_of_backend:
            error = _prepare_resume(job)
            if error is None:
                group.append(job)
            elif (delay := _start_failed(job, backend, error)) is not None:
                retry_in.append(delay)
        outcomes = _submit(backend, group)
        for job in group:
            error = outcomes[job.pk]
            if error is not None:
                delay = _start_failed(job, backend, error)
                if delay is not None:
                    retry_in.append(delay)
        submitted = [job for job in group if outcomes[job.pk] is None]
        if submitted:
            started += _after_start_many(
                submitted, backend, *_started_as(backend), JobStatus.DISPATCHING
            )
    if retry_in:  # one later sweep for every job this one had to put off
        enqueue_now(tasks.jobs_dispatch_task, countdown=min(retry_in))
    return started


def _prepare_resume(job: Job, start: int = 0) -> Exception | None:
    """A later attempt continues from the job's latest checkpoint (jobs.services.checkpoints);
    a store that can't be read now puts the start off rather than starting over."""
    if job.attempt == 1 and start == 0 and not job.checkpoint_source_id:
        return None
    try:
        job_resume_prepare(job=job, start=start)
    except Exception as error:
        log.warning("job %s: the checkpoint store could not be read: %s", job.pk, error)
        return BackendUnavailable(f"the checkpoint store could not be read ({error})")
    return None


def _submit(backend: ComputeBackend, jobs: list[Job]) -> dict[int, Exception | None]:
    """Start the jobs on the backend: the error of each that failed, or None."""
    if not backend.assigns_devices:
        return backend.submit_many(jobs)
    outcomes: dict[int, Exception | None] = {}
    for job in jobs:  # devices are handed out one start at a time
        try:
            _assign_devices(job, backend)
            backend.submit(job)
        except Exception as error:
            outcomes[job.pk] = error
        else:
            outcomes[job.pk] = None
    return outcomes


def _started_as(backend: ComputeBackend) -> tuple[str, str]:
    """The status (and reason) a dispatched job has: a process starts at once, pods
    still have to be scheduled."""
    if backend.starts_immediately:
        return JobStatus.RUNNING, "started"
    return JobStatus.PROVISIONING, "submitted to the cluster"


def _start_failed(job: Job, backend: ComputeBackend, error: Exception) -> float | None:
    """What a failed start leaves: a rejected job fails; an unavailable backend gets a
    retry note and waits; an unexpected error is counted (`_dispatch_failed`). Returns in
    how many seconds the job is due again (None: it won't be)."""
    if isinstance(error, BackendRejected):
        transition_quietly(job, JobStatus.FAILED, SYSTEM, f"dispatch failed: {error}")
        return None
    if isinstance(error, BackendUnavailable):
        job_retry_note(job=job, reason=f"retrying: {error}")
        return _retry_later(job, RETRY_UNAVAILABLE_SECONDS)
    return _dispatch_failed(job, backend, error)


def _retry_later(job: Job, seconds: float) -> float:
    """Release the job's claim and make it due again in `seconds`."""
    Job.objects.filter(pk=job.pk, status=JobStatus.DISPATCHING).update(
        dispatch_claimed_by="",
        dispatch_claimed_until=None,
        dispatch_after=timezone.now() + timedelta(seconds=seconds),
    )
    return seconds


def job_backend_resume(*, job: Job) -> Job:
    """Task side of a resume: start the suspended attempt again on its backend."""
    job.refresh_from_db(from_queryset=Job.objects.with_backend_relations())
    if job.status != JobStatus.RESUMING:
        return job
    backend = get_backend(job.backend)
    # The same count the local backend names its starts by: this is the n-th resume.
    error = _prepare_resume(job, start=job.events.filter(to_status=JobStatus.RESUMING).count())
    if error is not None:
        raise error  # BackendUnavailable: the task retries it
    try:
        _assign_devices(job, backend)
        backend.resume(job)
    except BackendRejected as error:
        return transition_quietly(job, JobStatus.FAILED, SYSTEM, f"resume failed: {error}")
    if backend.starts_immediately:
        return _after_start(
            job, backend, JobStatus.RUNNING, "resumed from the checkpoint", JobStatus.RESUMING
        )
    job.refresh_from_db()
    if job.status in UNDO_AFTER:
        _undo(job, backend)
    return job


def _after_start(job: Job, backend: ComputeBackend, to: str, reason: str, source: str) -> Job:
    """`_after_start_many` for one job: the job as started, or as it is now."""
    started = _after_start_many([job], backend, to, reason, source)
    return started[0] if started else job


def _after_start_many(
    jobs: list[Job], backend: ComputeBackend, to: str, reason: str, source: str
) -> list[Job]:
    """Record that the backend calls started the jobs' attempts, except for jobs that
    left `source` meanwhile (`jobs_transition_many` locks and re-reads the rows): those
    are read again, and one cancelled or failed meanwhile has what was just started
    undone (others were e.g. a duplicate dispatch, or the watcher got there first)."""
    # When each job became `source`, unless a retry note has touched that time since.
    entered_source_at = {
        job.pk: job.status_changed_at if job.wait_kind != WaitKind.RETRY else None for job in jobs
    }
    started = jobs_transition_many(
        jobs=jobs, to=to, actor=SYSTEM, reason=reason, expected_from=frozenset({source})
    )
    if source == JobStatus.DISPATCHING:
        for job in started:
            dispatch_latency_observe(
                job=job, backend_name=backend.name, admitted_at=entered_source_at[job.pk]
            )
    started_ids = {job.pk for job in started}
    for job in jobs:
        if job.pk not in started_ids:
            job.refresh_from_db()
            if job.status in UNDO_AFTER:
                _undo(job, backend)
    return started


def _undo(job: Job, backend: ComputeBackend) -> None:
    """Stop what a dispatch started for a job that ended meanwhile. An unreachable backend
    hands the stop to `job_cancel_task`, which retries it: raising here would end a
    sweep's batch early, and a later sweep skips a job no longer dispatching."""
    log.info("job %s became %s while it was being started: stopping it", job.pk, job.status)
    try:
        backend.cancel(job)
    except BackendUnavailable as error:
        log.warning("stopping job %s failed (%s): retried by its cancel task", job.pk, error)
        enqueue_on_commit(tasks.job_cancel_task, job.pk)


def _dispatch_failed(job: Job, backend: ComputeBackend, error: Exception) -> float | None:
    """Count an unexpected dispatch error; fail the job at DISPATCH_MAX_ATTEMPTS (undoing
    whatever the attempt left), else note it and put it off (doubling waits)."""
    log.exception("dispatch of job %s failed unexpectedly", job.pk)
    Job.objects.filter(pk=job.pk).update(dispatch_failures=F("dispatch_failures") + 1)
    job.refresh_from_db(fields=["dispatch_failures"])
    limit = settings.DISPATCH_MAX_ATTEMPTS
    described = f"{type(error).__name__}: {error}"[:300]
    if job.dispatch_failures >= limit:
        transition_quietly(
            job,
            JobStatus.FAILED,
            SYSTEM,
            f"dispatch failed {job.dispatch_failures} times; last error: {described}",
            expected_from=frozenset({JobStatus.DISPATCHING}),
        )
        try:
            backend.cancel(job)
        except Exception:  # best effort: the reconciler stops what still runs
            log.exception("undoing the failed dispatch of job %s failed", job.pk)
        return None
    job_retry_note(
        job=job, reason=f"retrying after an error ({job.dispatch_failures}/{limit}): {described}"
    )
    wait = RETRY_FIRST_SECONDS * 2 ** (job.dispatch_failures - 1)
    return _retry_later(job, min(wait, RETRY_MAX_SECONDS))


def _assign_devices(job: Job, backend: ComputeBackend) -> None:
    """Hand the attempt GPU devices no other live job of its backend holds, where the
    console assigns them (a host's GPUs), before the backend starts it."""
    if backend.assigns_devices and job.gpus_per_node and not job.assigned_devices:
        _assign_free_devices(job, backend)


@transaction.atomic
def _assign_free_devices(job: Job, backend: ComputeBackend) -> None:
    """On PostgreSQL a transaction-scoped advisory lock per backend serialises assignments,
    so two dispatches can't both read the same devices as free (SQLite serialises
    writers by itself)."""
    if connection.vendor == "postgresql":
        key = zlib.crc32(f"gpugeek:devices:{job.backend}".encode())
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
    busy: set[int] = set()
    others = Job.objects.filter(backend=job.backend).holding_compute().exclude(pk=job.pk)
    for devices in others.values_list("assigned_devices", flat=True):
        busy.update(devices or [])
    job.assigned_devices = backend.assign_devices(job, busy)
    Job.objects.filter(pk=job.pk).update(assigned_devices=job.assigned_devices)


def transition_quietly(job: Job, to: str, actor: Actor, reason: str, **changes) -> Job:
    """Apply a transition a racing action may already have made moot (e.g. a cancel)."""
    try:
        return job_transition(job=job, to=to, actor=actor, reason=reason, **changes)
    except IllegalTransition:
        job.refresh_from_db()
        return job
