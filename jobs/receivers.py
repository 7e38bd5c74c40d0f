"""Where jobs plugs into the rooms below it (console's dashboard and tenant suspension,
marketplace's registry logins) and registers its own launch policy. Connected once, from
`JobsConfig.ready()`."""

from __future__ import annotations

from celery import signals as celery_signals
from django.conf import settings
from django.db import transaction

from console.dashboard import dashboard_section_register
from console.host_access import host_isolation_register
from console.metrics import scrape_collector_register
from console.queueing import enqueue_now, enqueue_on_commit
from console.signals import membership_changed
from console.tenant_admin import tenant_reactivated, tenant_suspended
from jobs import tasks
from jobs.extensions import job_deleting, launch_policy_register
from jobs.models import Job
from jobs.prometheus import JobsCollector
from jobs.realtime import publish_membership_changed
from jobs.selectors import dashboard_jobs_context, host_jobs_isolation
from jobs.services.actions import jobs_pause_for_suspension
from jobs.services.admission import jobs_admit
from jobs.services.launch import SuspensionLaunchPolicy
from jobs.tasks import job_files_discard_task
from marketplace.signals import registry_credential_removed


def remove_pull_secret_copies(sender, tenant_id: int, registry: str, **kwargs) -> None:
    enqueue_on_commit(tasks.registry_pull_secret_remove_task, tenant_id, registry)


def pause_suspended_tenant(sender, tenant, reason: str, **kwargs) -> None:
    jobs_pause_for_suspension(tenant=tenant, reason=reason)


def readmit_reactivated(sender, tenant, **kwargs) -> None:
    """Its queued jobs may take compute again; paused ones stay paused for their users."""
    jobs_admit()


def sync_sandbox_capacity_now(sender=None, **kwargs) -> None:
    """With the sandbox cluster, its pools are synced as soon as a worker is up, so that
    offers say "simulated" on the first visit rather than after the first beat period."""
    if settings.SANDBOX_URL:
        enqueue_now(tasks.capacity_sync_task)


def recheck_sockets_on_membership_change(sender, tenant_id: int, user_id: int, **kwargs) -> None:
    publish_membership_changed(tenant_id=tenant_id, user_id=user_id)


def discard_deleted_jobs_files(sender, job_ids: list[int], **kwargs) -> None:
    """After the deletion commits, each backend removes what it kept of those jobs."""
    by_backend: dict[str, list[int]] = {}
    for pk, backend in Job.objects.filter(pk__in=job_ids).values_list("pk", "backend"):
        by_backend.setdefault(backend, []).append(pk)
    for backend, ids in by_backend.items():
        transaction.on_commit(
            lambda backend=backend, ids=ids: job_files_discard_task.delay(backend, ids)
        )


def connect() -> None:
    celery_signals.worker_ready.connect(sync_sandbox_capacity_now, weak=False)
    dashboard_section_register(dashboard_jobs_context)
    registry_credential_removed.connect(
        remove_pull_secret_copies, dispatch_uid="jobs-remove-pull-secret-copies"
    )
    launch_policy_register(SuspensionLaunchPolicy())
    tenant_suspended.connect(pause_suspended_tenant, dispatch_uid="jobs-suspension-pause")
    tenant_reactivated.connect(readmit_reactivated, dispatch_uid="jobs-suspension-readmit")
    scrape_collector_register("jobs", JobsCollector())
    host_isolation_register("jobs", host_jobs_isolation)
    job_deleting.connect(discard_deleted_jobs_files, dispatch_uid="jobs-discard-files")
    membership_changed.connect(
        recheck_sockets_on_membership_change, dispatch_uid="jobs-membership-recheck"
    )
