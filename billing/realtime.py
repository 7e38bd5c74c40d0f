"""Budget alerts on the tenant's live channel (`tenant.<id>`), after commit."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from jobs.realtime import send_to_group, tenant_group


def publish_budget_alert(*, budget, threshold: int, kind: str, spend: Decimal) -> None:
    message = {
        "type": "alert",
        "scope": "budget",
        "budget": budget.name,
        "threshold": threshold,
        "kind": kind,
        "spend": str(spend),
        "amount": str(budget.amount),
    }
    tenant_id = budget.tenant_id
    transaction.on_commit(lambda: send_to_group(tenant_group(tenant_id), message))
