"""Billing's sections on marketplace pages, through `marketplace.extensions` (the
marketplace never imports billing). `register()` is called from `BillingConfig.ready()`.
"""

from __future__ import annotations

from billing.selectors import price_gaps
from marketplace.extensions import Panel, price_book_panel_register


def price_gaps_panel() -> Panel | None:
    """Usage metered at zero for want of a price: the staff's cue to publish one."""
    gaps = price_gaps()
    if not gaps:
        return None
    return Panel(template_name="billing/partials/price_gaps.html", context={"price_gaps": gaps})


def register() -> None:
    price_book_panel_register("billing.price_gaps", price_gaps_panel)
