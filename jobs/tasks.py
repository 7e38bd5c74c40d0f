"""Celery tasks for jobs: thin, each loads by id and calls one service; safe to rerun."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from jobs import services
from jobs.backends import BackendUnavailable, configured_backends, get_backend
from jobs.logs.archive import logs_archive_finished
from jobs.metrics import metrics_collect, metrics_downsample
from jobs.models import Job, JobStatus
from jobs.services.dispatch import DispatchRetry
from jobs.services.files import job_files_discard, jobs_files_prune
from jobs.services.launch_dispatch import dispatch_launched
from marketplace.services import capacity_sync

log = logging.getLogger(__name__)

RETRY = {
    "autoretry_for": (BackendUnavailable,),
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": None,
    "acks_late": True,
}


# An unexpected dispatch error is counted by the service, which raises DispatchRetry
# until DISPATCH_MAX_ATTEMPTS and then fails the job.
@shared_task(**{**RETRY, "autoretry_for": (BackendUnavailable, DispatchRetry)})
def job_dispatch_task(job_id: int) -> None:
    job = Job.objects.with_backend_relations().filter(pk=job_id).first()
    if job is None:  # deleted meanwhile: nothing to do
        return
    services.job_dispatch(job=job, fresh=True)


@shared_task(acks_late=True)
def jobs_dispatch_task(job_ids: list[int]) -> None:
    """Dispatch a batch of admitted jobs (a full admission pass queues one); a job that
    fails in it is handed to its own job_dispatch_task."""
    services.jobs_dispatch(job_ids=job_ids)


@shared_task(bind=True, acks_late=True)
def jobs_dispatch_launched_task(self) -> None:
    """Dispatch the launches listed since the last sweep, in batches
    (`jobs.services.launch_dispatch`); a redelivery of this task redoes its claimed
    batch."""
    dispatch_launched(sweep_id=self.request.id or "eager")


@shared_task(**RETRY)
def job_suspend_task(job_id: int) -> None:
    job = Job.objects.filter(pk=job_id).first()
    # Only while pausing: a retry or a reconciler's copy that runs after the job was
    # resumed (or finished) must not stop it again.
    if job is not None and job.status == JobStatus.PAUSING:
        get_backend(job.backend).suspend(job)


@shared_task(**RETRY)
def job_resume_task(job_id: int) -> None:
    job = Job.objects.filter(pk=job_id).first()
    if job is not None:
        services.job_backend_resume(job=job)


@shared_task(**RETRY)
def job_cancel_task(job_id: int) -> None:
    job = Job.objects.filter(pk=job_id).first()
    if job is not None:
        get_backend(job.backend).cancel(job)


@shared_task(**RETRY)
def job_release_task(job_id: int) -> None:
    """Remove what a finished job left on its backend (e.g. its Service and Secret)."""
    job = Job.objects.filter(pk=job_id).first()
    if job is not None:
        get_backend(job.backend).release(job)


@shared_task(**RETRY)
def registry_pull_secret_remove_task(tenant_id: int, registry: str) -> None:
    """A tenant removed its login to `registry`: remove its copies from the backends."""
    for backend in configured_backends():
        if backend.copies_pull_secrets:
            backend.remove_pull_secret(tenant_id, registry)


@shared_task(acks_late=True)
def capacity_sync_task() -> None:
    """Refresh every configured backend's pools; one unreachable backend doesn't stop the
    others, and its pools keep their last known capacity until it answers again."""
    for backend in configured_backends():
        try:
            capacity_sync(backend=backend)
        except BackendUnavailable as error:
            log.warning("capacity sync of %s failed: %s", backend.name, error)


@shared_task(acks_late=True)
def jobs_reconcile_task() -> None:
    services.jobs_reconcile()


@shared_task(acks_late=True)
def jobs_observe_task() -> None:
    """Fallback observation pass (the watcher does this continuously)."""
    for name in settings.COMPUTE_BACKENDS:
        try:
            services.jobs_observe(backend_name=name)
        except BackendUnavailable:
            continue


@shared_task(acks_late=True)
def metrics_collect_task() -> None:
    """GPU samples of running jobs (NVML locally, Prometheus/DCGM on Kubernetes), alerts."""
    metrics_collect()


@shared_task(acks_late=True)
def metrics_downsample_task() -> None:
    metrics_downsample()


@shared_task(acks_late=True)
def logs_archive_task() -> None:
    """Compress the full log of finished jobs so it outlives their pods."""
    logs_archive_finished()


@shared_task(acks_late=True)
def job_files_discard_task(backend_name: str, job_ids: list[int]) -> None:
    job_files_discard(backend_name=backend_name, job_ids=job_ids)


@shared_task(acks_late=True)
def jobs_files_prune_task() -> None:
    jobs_files_prune(now=timezone.now())
