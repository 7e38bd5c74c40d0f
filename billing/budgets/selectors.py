"""Budget reads: this month's spend and forecast of each budget, and whether a used-up
budget refuses a launch. Spend is read from the daily rollups, like the Cost Explorer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import QuerySet, Sum
from django.utils import timezone

from billing.models import Budget, BudgetAction, BudgetAlert, LiveUsageRollup
from billing.selectors import forecast_month_end, period_end, period_start
from console.models import Tenant
from jobs.models import Job, Priority
from services.models import Service


def _scope(budget: Budget) -> QuerySet[LiveUsageRollup]:
    rollups = LiveUsageRollup.objects.for_tenant(budget.tenant).filter(bucket="day")
    return rollups.filter(project=budget.project) if budget.project else rollups


def budget_services(budget: Budget) -> QuerySet[Service]:
    """The services a budget covers: its tenant's, unless it is a project's (services
    belong to no project)."""
    services = Service.objects.for_tenant(budget.tenant)
    return services.none() if budget.project else services


def budget_jobs(budget: Budget) -> QuerySet[Job]:
    """The jobs a budget covers: its tenant's, or only its project's."""
    jobs = Job.objects.for_tenant(budget.tenant)
    return jobs.filter(project=budget.project) if budget.project else jobs


def budget_spend(budget: Budget, now: datetime) -> Decimal:
    total = (
        _scope(budget)
        .filter(bucket_start__gte=period_start(now), bucket_start__lt=period_end(now))
        .aggregate(s=Sum("amount"))["s"]
    )
    return Decimal(total or 0)


def budget_forecast(budget: Budget, now: datetime, spend: Decimal | None = None) -> Decimal:
    """The budget's month-end forecast (`billing.selectors.forecast_month_end`)."""
    spend = budget_spend(budget, now) if spend is None else spend
    return forecast_month_end(jobs=budget_jobs(budget), spend=spend, now=now)


@dataclass
class BudgetStatus:
    budget: Budget
    spend: Decimal
    forecast: Decimal

    @property
    def percent(self) -> Decimal:
        return (self.spend / self.budget.amount * 100).quantize(Decimal("0.1"))

    @property
    def forecast_percent(self) -> Decimal:
        return (self.forecast / self.budget.amount * 100).quantize(Decimal("0.1"))

    @property
    def exhausted(self) -> bool:
        return self.spend >= self.budget.amount

    @property
    def blocking(self) -> bool:
        return self.exhausted and self.budget.action == BudgetAction.PAUSE_NON_CRITICAL


def budget_statuses(*, tenant: Tenant, now: datetime | None = None) -> list[BudgetStatus]:
    now = now or timezone.now()
    statuses = []
    budgets = Budget.objects.for_tenant(tenant).order_by("name", "pk")
    for budget in budgets:
        budget.tenant = tenant
        spend = budget_spend(budget, now)
        statuses.append(BudgetStatus(budget, spend, budget_forecast(budget, now, spend)))
    return statuses


def budget_blocks_launch(*, tenant: Tenant, project: str, priority: str) -> Budget | None:
    """The exhausted pause-action budget that refuses a new non-critical launch, if any."""
    if priority == Priority.CRITICAL:
        return None
    for status in budget_statuses(tenant=tenant):
        if status.blocking and (not status.budget.project or status.budget.project == project):
            return status.budget
    return None


def budget_alerts_recent(*, tenant: Tenant, limit: int = 20) -> QuerySet[BudgetAlert]:
    """The tenant's latest threshold alerts, newest first, for the budgets page."""
    return BudgetAlert.objects.for_tenant(tenant).select_related("budget")[:limit]
