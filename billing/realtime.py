"""Budget alerts on the tenant's live channel (`tenant.<id>`), after commit."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from jobs.realtime import now_iso, send_to_group, tenant_group


def publish_budget_alert(*, budget, threshold: int, kind: str, spend: Decimal) -> None:
    """Every open page of the tenant shows it as a message: like any tenant alert
    (`jobs.realtime.TenantAlertMessage`) it carries the `message` and `severity` the
    pages display, with the budget's figures beside them."""
    crossed = "reached" if kind == "actual" else "is forecast to reach"
    figure = "spend" if kind == "actual" else "forecast"
    message = {
        "type": "alert",
        "scope": "budget",
        "budget": budget.name,
        "threshold": threshold,
        "kind": kind,
        "spend": str(spend),
        "amount": str(budget.amount),
        "severity": "critical" if kind == "actual" and threshold >= 100 else "warning",
        "message": (
            f"Budget “{budget.name}” {crossed} {threshold} % ({figure} {spend:.2f} of "
            f"{budget.amount:.2f} {budget.currency} this month)."
        ),
        "at": now_iso(),
    }
    tenant_id = budget.tenant_id
    transaction.on_commit(lambda: send_to_group(tenant_group(tenant_id), message))
