"""Observed state: what the backends report becomes state-machine transitions; max
runtime and grace periods are enforced; lost dispatches are redone."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.queueing import enqueue_on_commit
from jobs import tasks
from jobs.actors import BACKEND, SYSTEM
from jobs.backends import BackendUnavailable, ComputeBackend, Observation, get_backend
from jobs.models import FINISHED, HOLDING_COMPUTE, ON_BACKEND, STOPPING, Job, JobStatus, WaitKind
from jobs.services.admission import job_pools, jobs_admit
from jobs.services.dispatch import dispatch_sweep_now, transition_quietly
from jobs.services.preemption import job_requeue_preempted
from jobs.state import job_run_seconds, job_wait_update

log = logging.getLogger(__name__)


def job_apply_observation(*, job: Job, observation: Observation) -> Job:
    """Map what the backend sees onto the state machine (the watcher's single entry)."""
    phase, status = observation.phase, job.status
    if status in FINISHED:
        return job
    changes: dict[str, Any] = {}
    if observation.exit_code is not None:
        changes["exit_code"] = observation.exit_code
    if status == JobStatus.CANCELLING:
        if phase in ("running", "pending"):
            return job  # still stopping: it holds its compute, and is billed, until it ends
        # However the work ended (stopped, exited meanwhile, lost), the cancel decides;
        # its bill ends now, when the end is observed.
        job = transition_quietly(
            job,
            JobStatus.CANCELLED,
            BACKEND,
            f"{job.status_reason}; compute released",
            assigned_devices=[],
            **changes,
        )
        return _released(job)
    if phase == "running" and status in (
        JobStatus.PROVISIONING,
        JobStatus.RESUMING,
        JobStatus.DISPATCHING,
    ):
        return transition_quietly(job, JobStatus.RUNNING, BACKEND, "running")
    if (
        phase == "pending"
        and status in (JobStatus.PROVISIONING, JobStatus.RESUMING)
        and observation.reason
    ):
        # Why it isn't running yet (Kueue admission, scheduling, image pull): shown as is.
        return job_wait_update(job=job, kind=WaitKind.BACKEND, reason=observation.reason)
    if phase == "succeeded" and status in HOLDING_COMPUTE:
        job = transition_quietly(job, JobStatus.SUCCEEDED, BACKEND, "completed", **changes)
    elif phase == "failed" and status in HOLDING_COMPUTE:
        job = transition_quietly(job, JobStatus.FAILED, BACKEND, observation.reason, **changes)
    elif phase in ("suspended", "cancelled") and status == JobStatus.PAUSING:
        # A budget pause keeps its reason (it names the budget) on the paused job.
        reason = (
            f"{job.status_reason}; compute released"
            if job.paused_by_budget
            else "stopped; compute released"
        )
        job = transition_quietly(
            job, JobStatus.PAUSED, BACKEND, reason, assigned_devices=[], **changes
        )
    elif phase == "preempted" and status in (
        JobStatus.RUNNING,
        JobStatus.PROVISIONING,
        JobStatus.RESUMING,
    ):
        job = transition_quietly(
            job, JobStatus.PREEMPTED, BACKEND, observation.reason or "spot capacity reclaimed"
        )
        if job.status == JobStatus.PREEMPTED:
            job = job_requeue_preempted(job=job)
    elif phase == "missing" and status in (
        JobStatus.RUNNING,
        JobStatus.PROVISIONING,
        JobStatus.RESUMING,
        JobStatus.PAUSING,
    ):
        job = transition_quietly(job, JobStatus.FAILED, BACKEND, f"lost: {observation.reason}")
    else:
        return job
    return _released(job)


def _released(job: Job) -> Job:
    """After an observed change: a job that no longer holds compute frees it for the
    queue (and, finished, has what it left on its backend removed)."""
    if job.status not in HOLDING_COMPUTE:
        if job.status in FINISHED and get_backend(job.backend).releases_after_finish:
            enqueue_on_commit(tasks.job_release_task, job.pk)
        jobs_admit(pools=job_pools(job))
    return job


def jobs_observe(
    *, backend_name: str, now: datetime | None = None, job_ids: Iterable[int] | None = None
) -> int:
    """One watcher pass over a backend's live jobs: apply observations, enforce max
    runtime and grace periods. `job_ids` limits the pass to those jobs (the ones the
    Kubernetes watch saw change). Returns how many jobs were looked at.

    Each job is observed on its own: whatever one job's observation raises (a backend
    that can't be reached, junk in its state) is logged with its id, and the pass goes
    on, so one job can never keep the others from being observed (and stopped, billed
    right). The next pass tries it again."""
    now = now or timezone.now()
    backend = get_backend(backend_name)
    live = Job.objects.filter(backend=backend_name, status__in=ON_BACKEND).select_related(
        "gpu_type"
    )
    if job_ids is not None:
        live = live.filter(pk__in=list(job_ids))
    jobs = list(live)
    for job in jobs:
        try:
            _observe_one(job, backend, now)
        except BackendUnavailable as error:
            log.warning("observing job %s failed: %s", job.pk, error)
        except Exception:
            log.exception("observing job %s failed; the pass goes on", job.pk)
    if backend.enforces_grace:
        # Jobs told to stop get SIGKILL once their grace period is over.
        recently_stopped = Job.objects.filter(
            backend=backend_name,
            status__in=[JobStatus.CANCELLED, JobStatus.FAILED, JobStatus.SUCCEEDED],
            finished_at__gte=now - timedelta(hours=1),
        )
        stopping = Job.objects.filter(backend=backend_name, status__in=STOPPING)
        for job in [*stopping, *recently_stopped]:
            try:
                backend.enforce_grace(job, settings.JOB_TERMINATION_GRACE_SECONDS)
            except Exception:
                log.exception("enforcing the grace period of job %s failed", job.pk)
    return len(jobs)


def _observe_one(job: Job, backend: ComputeBackend, now: datetime) -> None:
    """Max runtime first (running time only, whatever the job's holding status), then
    what the backend sees."""
    if job_run_seconds(job, now) > job.max_runtime_minutes * 60:
        job = transition_quietly(
            job,
            JobStatus.FAILED,
            SYSTEM,
            f"exceeded the maximum runtime of {job.max_runtime_minutes} minutes",
        )
        if job.status == JobStatus.FAILED:
            backend.cancel(job)
            jobs_admit(pools=job_pools(job))
            return
    job_apply_observation(job=job, observation=backend.observe(job))


def jobs_reconcile(
    *,
    now: datetime | None = None,
    stuck_after_seconds: int = 60,
    finished_window_seconds: int = 900,
) -> list[int]:
    """Redo what a lost task (a broker outage at commit, a Redis restart) left undone, by
    the age of each job's status. Returns the ids of the jobs acted on.

    - `dispatching` too long: a dispatch sweep (it takes every due row, a lapsed claim's too);
    - `pausing` too long: tell the backend to suspend again;
    - `cancelling` too long: tell the backend to cancel again;
    - `resuming` too long: resume again (idempotent);
    - `provisioning` too long: observe it now (the watch may have missed a change);
    - finished (within `finished_window_seconds`) but still running on the backend: cancel
      there; on backends that leave objects behind, release them again.
    """
    now = now or timezone.now()
    stuck_before = now - timedelta(seconds=stuck_after_seconds)
    acted: set[int] = set()
    redo: dict[str, Any] = {
        JobStatus.PAUSING: tasks.job_suspend_task,
        JobStatus.CANCELLING: tasks.job_cancel_task,
        JobStatus.RESUMING: tasks.job_resume_task,
    }
    stuck = Job.objects.filter(
        status__in=[*redo, JobStatus.DISPATCHING, JobStatus.PROVISIONING],
        status_changed_at__lt=stuck_before,
    )
    provisioning: dict[str, list[int]] = {}
    sweep = False
    for job_id, status, backend_name in stuck.values_list("pk", "status", "backend"):
        if status == JobStatus.PROVISIONING:
            provisioning.setdefault(backend_name, []).append(job_id)
        elif status == JobStatus.DISPATCHING:
            sweep = True
        else:
            enqueue_on_commit(redo[status], job_id)
        acted.add(job_id)
    if sweep:
        transaction.on_commit(dispatch_sweep_now)
    for backend_name, job_ids in provisioning.items():
        try:
            jobs_observe(backend_name=backend_name, now=now, job_ids=job_ids)
        except Exception:
            log.exception("observing provisioning jobs of %s failed", backend_name)
    finished = Job.objects.filter(
        status__in=FINISHED,
        finished_at__lt=stuck_before,
        finished_at__gte=now - timedelta(seconds=finished_window_seconds),
    )
    for job in finished:
        if _reconcile_finished(job):
            acted.add(job.pk)
    jobs_admit()
    return sorted(acted)


def _reconcile_finished(job: Job) -> bool:
    """Stop a finished job its backend still runs, or release what it left behind."""
    backend = get_backend(job.backend)
    try:
        phase = backend.observe(job).phase
    except Exception:
        log.exception("observing finished job %s failed", job.pk)
        return False
    if phase in ("running", "pending"):
        enqueue_on_commit(tasks.job_cancel_task, job.pk)
        return True
    if backend.releases_after_finish:
        enqueue_on_commit(tasks.job_release_task, job.pk)
        return True
    return False
