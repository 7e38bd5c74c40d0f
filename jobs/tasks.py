"""Celery tasks for jobs: thin, each loads by id and calls one service; safe to rerun."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

# Modules, not names: services import this module to queue its tasks (the cycle
# resolves at call time).
from jobs import metrics, services
from jobs.backends import BackendUnavailable, configured_backends, get_backend
from jobs.logs import archive
from jobs.models import Job, JobStatus
from marketplace import services as marketplace_services
from marketplace.models import SuspectNode

log = logging.getLogger(__name__)

RETRY = {
    "autoretry_for": (BackendUnavailable,),
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": None,
    "acks_late": True,
}


@shared_task(bind=True, acks_late=True)
def jobs_dispatch_task(self) -> None:
    """The one dispatch task: start every admitted job (`dispatching` rows), in batches
    (`jobs.services.dispatch`); a redelivery of this task takes its own claims again."""
    services.jobs_dispatch_pending(sweep_id=self.request.id)


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
def job_preempted_stop_task(job_id: int, attempt: int) -> None:
    """Stop attempt `attempt` of a job admission preempted (SIGTERM, the grace period to
    checkpoint): only while its next attempt hasn't started, so a late copy of this
    task never stops the new one."""
    job = Job.objects.filter(pk=job_id).first()
    if job is not None:
        services.job_preempted_stop(job=job, attempt=attempt)


@shared_task(**RETRY)
def node_cordon_task(backend_name: str, node: str) -> None:
    """Cordon a node marked suspect (jobs.repair) on its cluster, where the console may;
    the row says whether it is."""
    if get_backend(backend_name).node_cordon(node):
        SuspectNode.objects.filter(name=node).update(cordoned=True)


@shared_task(**RETRY)
def node_uncordon_task(backend_name: str, node: str) -> None:
    """Staff marked a node healthy (jobs.repair.node_healthy): schedulable again, unless
    it was marked suspect once more meanwhile."""
    if not SuspectNode.objects.filter(name=node).exists():
        get_backend(backend_name).node_cordon(node, cordoned=False)


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
            marketplace_services.capacity_sync(backend=backend)
        except BackendUnavailable as error:
            log.warning("capacity sync of %s failed: %s", backend.name, error)
    services.jobs_admit()  # capacity may have appeared (or gone) in any pool


@shared_task(acks_late=True)
def jobs_reconcile_task() -> None:
    services.jobs_reconcile()


@shared_task(acks_late=True)
def metrics_collect_task() -> None:
    """GPU samples of running jobs (NVML locally, Prometheus/DCGM on Kubernetes), alerts."""
    metrics.metrics_collect()


@shared_task(acks_late=True)
def metrics_downsample_task() -> None:
    metrics.metrics_downsample()


@shared_task(acks_late=True)
def logs_archive_task() -> None:
    """Compress the full log of finished jobs so it outlives their pods."""
    archive.logs_archive_finished()


@shared_task(acks_late=True)
def job_files_discard_task(backend_name: str, job_ids: list[int]) -> None:
    services.job_files_discard(backend_name=backend_name, job_ids=job_ids)


@shared_task(acks_late=True)
def jobs_files_prune_task() -> None:
    services.jobs_files_prune(now=timezone.now())


@shared_task(acks_late=True)
def jobs_checkpoints_prune_task() -> int:
    """Keep CHECKPOINT_KEEP_LAST complete checkpoints per active job (safe to rerun)."""
    return services.jobs_checkpoints_prune()
