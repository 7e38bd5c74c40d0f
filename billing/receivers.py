"""Where billing plugs into the rooms below it: jobs' launch policies, cost provider and
deletion signal, storage's resizes and services' replicas removed (metered first),
marketplace's price-book panels, console's dashboard (payment failures) and staff
organisation pages (spend, balance due, credit, billing settings), and the database
views kept across migrations. Connected once, from `BillingConfig.ready()`."""

from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate

from billing import dbviews, panels, staff_tenants
from billing.budgets.services import BudgetLaunchPolicy, budget_refuses_service
from billing.dashboard import dashboard_money_context
from billing.job_costs import BillingJobCosts
from billing.metering.tick import (
    release_pending_usage,
    replicas_meter_before_removal,
    storage_meter_volume,
)
from billing.payments.credits import CreditLaunchPolicy
from billing.payments.selectors import dashboard_credit_context, dashboard_payments_context
from billing.prometheus import MeteringCollector
from console.dashboard import dashboard_section_register
from console.metrics import scrape_collector_register
from jobs import extensions
from services.signals import replicas_removing, service_creating
from storage.models import Volume
from storage.signals import volume_resizing


def job_deleting_keep_usage(sender, job_ids: list[int], **kwargs) -> None:
    """A deleted job's usage stays in the job rollups: move what its meter holds there
    first (this waits for any metering tick to end, and holds off the next)."""
    release_pending_usage(job_ids)


def volume_resizing_meter(sender, volume: Volume, **kwargs) -> None:
    """Bill a volume's time so far at its old size before it grows."""
    storage_meter_volume(volume_id=volume.pk)


def replicas_removing_meter(sender, replica_ids: list[int], **kwargs) -> None:
    """Bill replicas up to their stop before their rows go."""
    replicas_meter_before_removal(replica_ids=replica_ids)


def service_creating_refuse_over_budget(sender, tenant, priority: str, **kwargs) -> None:
    budget_refuses_service(tenant=tenant, priority=priority)


def connect(app_config: AppConfig) -> None:
    pre_migrate.connect(dbviews.drop_views, sender=app_config, dispatch_uid="billing-drop-views")
    post_migrate.connect(
        dbviews.create_views, sender=app_config, dispatch_uid="billing-create-views"
    )
    extensions.launch_policy_register(BudgetLaunchPolicy())
    extensions.launch_policy_register(CreditLaunchPolicy())
    extensions.job_cost_provider_register(BillingJobCosts())
    panels.register()
    dashboard_section_register(dashboard_payments_context, position=0)
    dashboard_section_register(dashboard_credit_context, position=10)
    dashboard_section_register(dashboard_money_context, position=20)
    staff_tenants.register()
    extensions.job_deleting.connect(
        job_deleting_keep_usage, dispatch_uid="billing-keep-deleted-job-usage"
    )
    volume_resizing.connect(volume_resizing_meter, dispatch_uid="billing-meter-volume-resize")
    replicas_removing.connect(replicas_removing_meter, dispatch_uid="billing-meter-replicas")
    service_creating.connect(
        service_creating_refuse_over_budget, dispatch_uid="billing-refuse-service-over-budget"
    )
    scrape_collector_register("metering", MeteringCollector())
