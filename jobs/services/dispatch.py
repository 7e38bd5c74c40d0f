"""Dispatch: start an admitted job's attempt (or a resumed one) on its backend.
Runs in Celery tasks after commit; safe to run twice.

Invariants:
- A cancel that lands while the backend call runs never leaves work running: the status
  change after the call re-reads the job under its row lock (`jobs_transition_many`), and a
  job cancelled (or failed) meanwhile has what this call started undone.
- An unexpected error is counted (`Job.dispatch_failures`) and retried; after
  DISPATCH_MAX_ATTEMPTS the job fails with the error, so it never holds capacity forever.
- Two dispatches on one backend never hand out the same GPU device (`_assign_devices`).
"""

from __future__ import annotations

import logging
import zlib
from collections import defaultdict

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from console.queueing import enqueue_on_commit
from jobs.actors import SYSTEM, Actor
from jobs.backends import BackendRejected, BackendUnavailable, ComputeBackend, get_backend
from jobs.models import Job, JobStatus, WaitKind
from jobs.prometheus import dispatch_latency_observe
from jobs.state import IllegalTransition, job_retry_note, job_transition, jobs_transition_many

log = logging.getLogger(__name__)
# Statuses a racing action may have ended the job in while its backend call ran; what
# the call started must then be undone.
UNDO_AFTER = frozenset({JobStatus.CANCELLING, JobStatus.CANCELLED, JobStatus.FAILED})


class DispatchRetry(Exception):
    """An unexpected dispatch error, counted; the task retries it (with backoff)."""


def job_dispatch(*, job: Job, fresh: bool = False) -> Job:
    """Start the admitted job's attempt on its backend. Safe to run twice.
    `fresh`: the caller has just read the job `with_backend_relations()`."""
    if not fresh:
        job.refresh_from_db(from_queryset=Job.objects.with_backend_relations())
    if job.status != JobStatus.DISPATCHING:
        return job  # done already, or cancelled meanwhile
    backend = get_backend(job.backend)
    try:
        _assign_devices(job, backend)
        backend.submit(job)
    except Exception as error:
        return _start_failed(job, backend, error)
    return _after_start(job, backend, *_started_as(backend), JobStatus.DISPATCHING)


def _started_as(backend: ComputeBackend) -> tuple[str, str]:
    """The status (and reason) a dispatched job has: a process starts at once, pods
    still have to be scheduled."""
    if backend.starts_immediately:
        return JobStatus.RUNNING, "started"
    return JobStatus.PROVISIONING, "submitted to the cluster"


def _start_failed(job: Job, backend: ComputeBackend, error: Exception) -> Job:
    """What a failed dispatch leaves: a rejected job fails; an unavailable backend gets a
    retry note and is raised again; an unexpected error is counted (`_dispatch_failed`,
    which raises DispatchRetry until the limit)."""
    if isinstance(error, BackendRejected):
        return transition_quietly(job, JobStatus.FAILED, SYSTEM, f"dispatch failed: {error}")
    if isinstance(error, BackendUnavailable):
        job_retry_note(job=job, reason=f"retrying: {error}")
        raise error
    return _dispatch_failed(job, backend, error)


def jobs_dispatch(*, job_ids: list[int]) -> list[Job]:
    """Dispatch many admitted jobs at once (`jobs.tasks.jobs_dispatch_task`): one read,
    their backend's `submit_many` (Kubernetes creates their objects concurrently), and
    one transaction moving those started. A job whose start fails here goes on alone
    through `job_dispatch_task` (its retries, failure count and limit), so one job's
    trouble never holds back or repeats the others'. Returns the jobs it started."""
    jobs = Job.objects.with_backend_relations().filter(pk__in=job_ids, status=JobStatus.DISPATCHING)
    by_backend: dict[str, list[Job]] = defaultdict(list)
    for job in jobs.order_by("pk"):
        by_backend[job.backend].append(job)
    started: list[Job] = []
    for name, group in by_backend.items():
        backend = get_backend(name)
        if backend.assigns_devices:  # devices are handed out one dispatch at a time
            for job in group:
                enqueue_on_commit("jobs.tasks.job_dispatch_task", job.pk)
            continue
        outcomes = backend.submit_many(group)
        for job in group:
            error = outcomes[job.pk]
            if error is None:
                continue
            try:
                _start_failed(job, backend, error)
            except (BackendUnavailable, DispatchRetry):
                enqueue_on_commit("jobs.tasks.job_dispatch_task", job.pk)
        submitted = [job for job in group if outcomes[job.pk] is None]
        if submitted:
            started += _after_start_many(
                submitted, backend, *_started_as(backend), JobStatus.DISPATCHING
            )
    return started


def job_backend_resume(*, job: Job) -> Job:
    """Task side of a resume: start the suspended attempt again on its backend."""
    job.refresh_from_db(from_queryset=Job.objects.with_backend_relations())
    if job.status != JobStatus.RESUMING:
        return job
    backend = get_backend(job.backend)
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
    sweep's batch early, and a retried dispatch skips a job no longer dispatching."""
    log.info("job %s became %s while it was being started: stopping it", job.pk, job.status)
    try:
        backend.cancel(job)
    except BackendUnavailable as error:
        log.warning("stopping job %s failed (%s): retried by its cancel task", job.pk, error)
        enqueue_on_commit("jobs.tasks.job_cancel_task", job.pk)


def _dispatch_failed(job: Job, backend: ComputeBackend, error: Exception) -> Job:
    """Count an unexpected dispatch error; fail the job at DISPATCH_MAX_ATTEMPTS (undoing
    whatever the attempt left), else note it and raise DispatchRetry for the task."""
    log.exception("dispatch of job %s failed unexpectedly", job.pk)
    Job.objects.filter(pk=job.pk).update(dispatch_failures=F("dispatch_failures") + 1)
    job.refresh_from_db(fields=["dispatch_failures"])
    limit = settings.DISPATCH_MAX_ATTEMPTS
    described = f"{type(error).__name__}: {error}"[:300]
    if job.dispatch_failures >= limit:
        job = transition_quietly(
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
        return job
    job_retry_note(
        job=job, reason=f"retrying after an error ({job.dispatch_failures}/{limit}): {described}"
    )
    raise DispatchRetry(described) from error


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
