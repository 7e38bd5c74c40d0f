"""Stripe webhooks: verified, stored once, applied in whatever order they arrive.

- The signature is checked by `stripe.Webhook.construct_event` on the raw body against
  `STRIPE_WEBHOOK_SECRET`, with Stripe's default 300 s tolerance. Without a secret every
  delivery is refused: an unverified body must never change an invoice.
- Each event id is stored once (`StripeEvent.event_id` is unique) in the transaction
  that applies it; a duplicate delivery, even a concurrent one, fails that insert (it
  waits for the first transaction, then conflicts) and changes nothing.
- Order doesn't matter: with an API key the object is read again from Stripe, and its
  current status is applied; without one (or when Stripe can't be reached) the event's
  own copy is. Either way only forward transitions of our lifecycle are applied
  (`billing.invoices.services`: paid, void and uncollectible are terminal but for
  uncollectible → paid), and a payment failure is recorded only on an open invoice. So a
  `payment_failed` or `voided` that arrives after `paid` leaves the invoice paid.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import stripe
from django.conf import settings
from django.db import IntegrityError, transaction

from billing.invoices import services as invoicing
from billing.models import (
    CreditPurchase,
    Invoice,
    InvoiceStatus,
    StripeEvent,
    StripeInvoice,
)
from billing.payments.client import (
    StripeRefused,
    StripeUnavailable,
    is_ours,
    stripe_call,
    stripe_configured,
)
from billing.payments.credits import credit_purchase_complete

log = logging.getLogger(__name__)

INVOICE_EVENTS = {
    "invoice.finalized",
    "invoice.paid",
    "invoice.payment_failed",
    "invoice.voided",
    "invoice.marked_uncollectible",
}
CHECKOUT_COMPLETED = "checkout.session.completed"
# Stripe's invoice status → ours; "draft" and "open" change nothing here.
STATUS_TARGETS = {
    "paid": InvoiceStatus.PAID,
    "void": InvoiceStatus.VOID,
    "uncollectible": InvoiceStatus.UNCOLLECTIBLE,
}
VIA = "stripe"


class WebhookRejected(Exception):
    """Not a verified Stripe event: answered 400, nothing written."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class WebhookOutcome:
    event_id: str
    type: str
    duplicate: bool
    outcome: str


def stripe_webhook_receive(*, payload: bytes, signature: str | None) -> WebhookOutcome:
    """Verify, store once and apply one delivery. Raises WebhookRejected."""
    secret = settings.STRIPE_WEBHOOK_SECRET
    if not secret:
        raise WebhookRejected("Stripe webhooks are off: STRIPE_WEBHOOK_SECRET is not set.")
    try:
        stripe.Webhook.construct_event(payload, signature, secret)
        event = json.loads(payload)
        event_id, event_type = str(event["id"]), str(event["type"])
        obj = dict(event["data"]["object"])
    except stripe.SignatureVerificationError:
        raise WebhookRejected("The Stripe signature is missing, wrong or too old.") from None
    except (ValueError, KeyError, TypeError):  # not JSON, not UTF-8, not an event
        raise WebhookRejected("The body is not a Stripe event.") from None
    if StripeEvent.objects.filter(event_id=event_id).exists():
        return WebhookOutcome(event_id, event_type, duplicate=True, outcome="")
    # Outside the transaction: no lock is held while Stripe answers.
    current = _read_again(event_type, obj)
    with transaction.atomic():
        try:
            with transaction.atomic():
                stored = StripeEvent.objects.create(
                    event_id=event_id, type=event_type, object_id=str(obj.get("id", ""))[:255]
                )
        except IntegrityError:  # a concurrent delivery of the same event got there first
            return WebhookOutcome(event_id, event_type, duplicate=True, outcome="")
        outcome = _apply(event_id, event_type, obj, current)
        stored.outcome = outcome[:300]
        stored.save(update_fields=["outcome"])
    return WebhookOutcome(event_id, event_type, duplicate=False, outcome=outcome)


def _read_again(event_type: str, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The object as Stripe has it now; None without a key or when Stripe can't say."""
    if not stripe_configured() or not obj.get("id"):
        return None
    object_id = str(obj["id"])
    found: stripe.StripeObject
    try:
        if event_type in INVOICE_EVENTS:
            found = stripe_call(lambda client: client.v1.invoices.retrieve(object_id))
        elif event_type == CHECKOUT_COMPLETED:
            found = stripe_call(lambda client: client.v1.checkout.sessions.retrieve(object_id))
        else:
            return None
    except (StripeUnavailable, StripeRefused) as error:
        log.warning("re-reading %s from Stripe failed (%s): using the event's", object_id, error)
        return None
    return found.to_dict()


def _apply(event_id: str, event_type: str, obj: dict[str, Any], current: dict | None) -> str:
    if event_type in INVOICE_EVENTS:
        return _apply_invoice(event_id, event_type, obj, current or obj)
    if event_type == CHECKOUT_COMPLETED:
        return _apply_checkout(event_id, current or obj)
    return "ignored: not an event this console handles"


def _our_invoice(obj: dict[str, Any]) -> Invoice | None:
    """Ours, by the Stripe id we stored, or (when the event beat our push's save) by the
    metadata we gave it, checked against our number."""
    stripe_id = str(obj.get("id", ""))
    known = StripeInvoice.objects.filter(stripe_invoice_id=stripe_id).select_related("invoice")
    match = known.first()
    if match is not None:
        return match.invoice
    metadata = obj.get("metadata") or {}
    pk, number = str(metadata.get("gpugeek_invoice", "")), metadata.get("gpugeek_number")
    if not is_ours(metadata) or not pk.isdigit() or not number:
        return None
    invoice = Invoice.objects.filter(pk=int(pk), number=number).first()
    if invoice is not None:
        StripeInvoice.objects.filter(invoice=invoice, stripe_invoice_id="").update(
            stripe_invoice_id=stripe_id
        )
    return invoice


def _apply_invoice(event_id: str, event_type: str, event_obj: dict, current: dict) -> str:
    invoice = _our_invoice(current)
    if invoice is None:
        return "ignored: not an invoice of this console"
    if current.get("hosted_invoice_url"):
        StripeInvoice.objects.filter(invoice=invoice, hosted_invoice_url="").update(
            hosted_invoice_url=current["hosted_invoice_url"]
        )
    # The row lock orders this against a staff action on the same invoice.
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    target = STATUS_TARGETS.get(str(current.get("status", "")))
    if target is not None:
        if not invoicing.invoice_can_become(invoice, target):
            return f"kept {invoice.status}: {target} is not a forward transition"
        invoicing.invoice_status_change(
            invoice=invoice, to=target, user=None, via=VIA, reference=event_id
        )
        return f"{invoice.number}: {invoice.status} → {target}"
    if event_type == "invoice.payment_failed":
        attempts = event_obj.get("attempt_count") or 1
        message = f"Stripe could not collect the payment (attempt {attempts})."
        if invoicing.invoice_payment_failure_record(
            invoice=invoice, message=message, via=VIA, reference=event_id
        ):
            return f"{invoice.number}: payment failure recorded"
        return f"kept {invoice.status}: a payment failure matters only while open"
    return f"{invoice.number}: nothing to change ({current.get('status')})"


def _apply_checkout(event_id: str, session: dict[str, Any]) -> str:
    purchase = CreditPurchase.objects.filter(
        stripe_checkout_session_id=str(session.get("id", ""))
    ).first()
    metadata = session.get("metadata") or {}
    if purchase is None and is_ours(metadata):
        # The event beat the save of the session id: found by the metadata we gave it.
        pk, tenant = (str(metadata.get(key, "")) for key in ("gpugeek_purchase", "gpugeek_tenant"))
        if pk.isdigit() and tenant.isdigit():
            purchase = CreditPurchase.objects.filter(pk=int(pk), tenant_id=int(tenant)).first()
    if purchase is None:
        return "ignored: not a credit purchase of this console"
    if session.get("payment_status") != "paid":
        return f"purchase {purchase.pk}: not paid yet ({session.get('payment_status')})"
    total = session.get("amount_total")
    amount = Decimal(int(total)) / 100 if total is not None else None
    currency = str(session.get("currency") or purchase.currency)
    if credit_purchase_complete(
        purchase=purchase, amount_paid=amount, currency=currency, reference=event_id
    ):
        return f"purchase {purchase.pk}: {purchase.amount} {purchase.currency} credited"
    return f"purchase {purchase.pk}: not credited again"
