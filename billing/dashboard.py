"""The dashboard's money panel (registered with console.dashboard by BillingConfig): what
a GPU cloud's users look for first — this month's spend, the burn rate of what runs now,
the month-end forecast, credit and budgets."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import Sum
from django.http import HttpRequest
from django.utils import timezone

from billing.budgets.selectors import budget_statuses
from billing.models import LiveUsageRollup
from billing.payments.selectors import credit_balance
from billing.selectors import forecast_month_end, period_end, period_start, run_rate
from console.permissions import Capability, has_capability
from jobs.models import Job
from marketplace.price_book_cache import price_book


def dashboard_money_context(request: HttpRequest) -> dict[str, Any]:
    tenant = getattr(request, "tenant", None)
    if tenant is None or not has_capability(request.membership, Capability.VIEW_TENANT):
        return {}
    if getattr(request, "htmx", False):  # the live job list's refresh shows no panels
        return {}
    now = timezone.now()
    spent = LiveUsageRollup.objects.for_tenant(tenant).filter(
        bucket="day", bucket_start__gte=period_start(now), bucket_start__lt=period_end(now)
    ).aggregate(s=Sum("amount"))["s"] or Decimal(0)
    jobs = Job.objects.for_tenant(tenant)
    book = price_book()
    return {
        "dashboard_panels": ["billing/partials/dashboard_money.html"],
        "money": {
            "currency": book.version.currency if book else "USD",
            "month_to_date": spent,
            "burn_rate": run_rate(jobs),
            "forecast": forecast_month_end(jobs=jobs, spend=spent, now=now),
            "credit": credit_balance(tenant=tenant),
            "budgets": budget_statuses(tenant=tenant, now=now)[:3],
            "can_see_credit": has_capability(request.membership, Capability.VIEW_INVOICES),
        },
    }
