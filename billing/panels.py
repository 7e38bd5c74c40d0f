"""Billing's sections on pages of the rooms below: the price book (through
`marketplace.extensions`) and the staff fleet page (through `jobs.extensions`); those rooms
never import billing. `register()` is called from `BillingConfig.ready()`.
"""

from __future__ import annotations

from django.db.models import Sum
from django.utils import timezone

from billing.models import LiveUsageRollup
from billing.selectors import period_end, period_start, price_gaps
from jobs.extensions import fleet_panel_register
from marketplace.extensions import Panel, price_book_panel_register


def price_gaps_panel() -> Panel | None:
    """Usage metered at zero for want of a price: the staff's cue to publish one."""
    gaps = price_gaps()
    if not gaps:
        return None
    return Panel(template_name="billing/partials/price_gaps.html", context={"price_gaps": gaps})


def revenue_this_month_panel() -> Panel:
    """Usage rated this month across all organisations, live hour included (what this
    month's invoices will draw from), per currency."""
    now = timezone.now()
    totals = (
        LiveUsageRollup.objects.filter(
            bucket="day", bucket_start__gte=period_start(now), bucket_start__lt=period_end(now)
        )
        .order_by()
        .values("currency")
        .annotate(amount=Sum("amount"))
        .order_by("currency")
    )
    return Panel(
        template_name="billing/partials/fleet_revenue.html",
        context={"revenue": list(totals), "period_start": period_start(now)},
    )


def register() -> None:
    price_book_panel_register("billing.price_gaps", price_gaps_panel)
    fleet_panel_register("billing.revenue_this_month", revenue_this_month_panel)
