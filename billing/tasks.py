"""Celery tasks of billing: thin, each calls one service."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from celery import shared_task

from billing.budgets import services as budgets
from billing.invoices import services as invoicing
from billing.models import Budget, CreditNote, Invoice
from billing.payments import stripe_sync
from billing.payments.client import StripeUnavailable
from console.queueing import enqueue_now
from console.service_errors import ServiceError

log = logging.getLogger(__name__)


@shared_task(acks_late=True)
def meter_tick_task() -> None:
    """Write usage since the last tick, then enforce the budgets it may have crossed."""
    budgets.meter_and_enforce()


@shared_task(
    bind=True,
    acks_late=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=6,
)
def budget_webhook_task(self, budget_id: int, payload: dict) -> None:
    budget = Budget.objects.filter(pk=budget_id).first()
    if budget is None or not budget.webhook_url:
        return
    try:
        budgets.budget_webhook_send(budget=budget, payload=payload)
    except ServiceError as error:  # refused now (e.g. its name resolves privately): no retry
        log.warning("budget %s webhook not sent: %s", budget_id, error.message)


@shared_task(acks_late=True)
def invoices_draft_monthly_task() -> None:
    """On the 1st: last month's drafts (safe to run twice: one draft per tenant)."""
    invoicing.invoices_draft_monthly(now=datetime.now(UTC))


# Every Stripe task: up to about 4 hours of backoff (5 s doubling to 30 min), well inside
# Stripe's 24 h memory of idempotency keys; after that the reconciler below queues it again.
STRIPE_RETRIES: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "autoretry_for": (StripeUnavailable,),
    "retry_backoff": 5,
    "retry_backoff_max": 1800,
    "retry_jitter": True,
    "max_retries": 16,
}


@shared_task(**STRIPE_RETRIES)
def invoice_push_to_stripe(self, invoice_id: int) -> None:
    """Push a finalized invoice to Stripe (safe to run twice: the same stored keys)."""
    invoice = Invoice.objects.filter(pk=invoice_id).first()
    if invoice is None:
        return
    stripe_sync.invoice_push(invoice=invoice)


@shared_task(**STRIPE_RETRIES)
def invoice_status_to_stripe(self, invoice_id: int) -> None:
    """Carry a void, uncollectible or out-of-band payment made here to Stripe."""
    invoice = Invoice.objects.filter(pk=invoice_id).first()
    if invoice is None:
        return
    stripe_sync.invoice_status_push(invoice=invoice)


@shared_task(**STRIPE_RETRIES)
def credit_note_push_to_stripe(self, credit_note_id: int) -> None:
    """Send a credit note to Stripe (safe to run twice: the same stored key)."""
    credit_note = CreditNote.objects.select_related("invoice").filter(pk=credit_note_id).first()
    if credit_note is None:
        return
    stripe_sync.credit_note_push(credit_note=credit_note)


@shared_task(acks_late=True)
def invoices_stripe_push_pending_task() -> None:
    """Reconciler: queue a push for each open invoice not yet at Stripe (a lost task, a
    broker outage at finalization, a key set afterwards), and for each credit note made
    since that isn't there either."""
    now = datetime.now(UTC)
    for invoice_id in stripe_sync.invoices_awaiting_push(now=now):
        enqueue_now(invoice_push_to_stripe, invoice_id)
    for credit_note_id in stripe_sync.credit_notes_awaiting_push(now=now):
        enqueue_now(credit_note_push_to_stripe, credit_note_id)
