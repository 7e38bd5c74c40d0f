"""Celery tasks of billing: thin, each calls one service."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from celery import shared_task

from billing import invoicing, services
from console.services import ServiceError

log = logging.getLogger(__name__)


@shared_task(acks_late=True)
def meter_tick_task() -> None:
    """Write usage since the last tick, then enforce the budgets it may have crossed."""
    services.meter_and_enforce()


@shared_task(
    bind=True,
    acks_late=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=6,
)
def budget_webhook_task(self, budget_id: int, payload: dict) -> None:
    from billing.models import Budget

    budget = Budget.objects.filter(pk=budget_id).first()
    if budget is None or not budget.webhook_url:
        return
    try:
        services.budget_webhook_send(budget=budget, payload=payload)
    except ServiceError as error:  # refused now (e.g. its name resolves privately): no retry
        log.warning("budget %s webhook not sent: %s", budget_id, error.message)


@shared_task(acks_late=True)
def invoices_draft_monthly_task() -> None:
    """On the 1st: last month's drafts (safe to run twice: one draft per tenant)."""
    invoicing.invoices_draft_monthly(now=datetime.now(UTC))
