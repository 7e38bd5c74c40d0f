"""Where jobs plugs into the rooms below it (console's dashboard and tenant suspension,
marketplace's registry logins) and registers its own launch policy. Connected once, from
`JobsConfig.ready()`."""

from __future__ import annotations

from celery import signals as celery_signals
from django.conf import settings

from console.dashboard import dashboard_section_register
from console.metrics import scrape_collector_register
from console.queueing import enqueue_now, enqueue_on_commit
from console.tenant_admin import tenant_reactivated, tenant_suspended
from jobs.extensions import launch_policy_register
from jobs.prometheus import JobsCollector
from jobs.selectors import dashboard_jobs_context
from jobs.services.actions import jobs_pause_for_suspension
from jobs.services.admission import jobs_admit
from jobs.services.launch import SuspensionLaunchPolicy
from marketplace.signals import registry_credential_removed


def remove_pull_secret_copies(sender, tenant_id: int, registry: str, **kwargs) -> None:
    enqueue_on_commit("jobs.tasks.registry_pull_secret_remove_task", tenant_id, registry)


def pause_suspended_tenant(sender, tenant, reason: str, **kwargs) -> None:
    jobs_pause_for_suspension(tenant=tenant, reason=reason)


def readmit_reactivated(sender, tenant, **kwargs) -> None:
    """Its queued jobs may take compute again; paused ones stay paused for their users."""
    jobs_admit()


def sync_sandbox_capacity_now(sender=None, **kwargs) -> None:
    """With the sandbox cluster, its pools are synced as soon as a worker is up, so that
    offers say "simulated" on the first visit rather than after the first beat period."""
    if settings.SANDBOX_URL:
        enqueue_now("jobs.tasks.capacity_sync_task")


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
