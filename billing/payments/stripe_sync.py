"""Our finalized invoices, pushed to Stripe: the tenant's Customer, one invoice item per
line (plus tax, rounding and credit), the Stripe invoice, finalized for online payment.

Exactly once, across timeouts and retries:
- Every creating call carries an idempotency key derived from our invoice number and
  line ids (`idempotency_key`), written to our rows and committed *before* the first
  call. A retry (the task's backoff, the reconciler) sends the same keys with the same
  parameters, so Stripe answers with what it already made: a request that timed out
  after Stripe received it never makes a second invoice.
- The items are planned once, with their amounts in cents, and stored
  (`StripeInvoiceItem`); a retry sends exactly those, even if the invoice was credited
  meanwhile (Stripe refuses a reused key with different parameters).
- No database transaction is open during a call: locks are never held over the network.
- Stripe keeps idempotency keys for 24 hours; the task's backoff gives up well before.

The Stripe invoice's total is our amount due at the push: line amounts are rounded to
the cent one by one, a rounding item makes their sum equal our total (rounded once), and
the credit and credit notes already applied are items of their own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import stripe
from django.db import transaction
from django.db.models import F, Q

# The module, not its names: invoices.services imports billing.tasks, which imports this
# module, so on that path invoices.services is still loading here.
from billing.invoices import services as invoicing
from billing.models import (
    CENTS,
    CreditNote,
    Invoice,
    InvoiceStatus,
    StripeCreditNote,
    StripeInvoice,
    StripeInvoiceItem,
    TenantBillingProfile,
)
from billing.payments.client import (
    StripeRefused,
    StripeUnavailable,
    idempotency_key,
    installation_metadata,
    stripe_call,
    stripe_configured,
)
from console.models import Tenant

log = logging.getLogger(__name__)
ZERO = Decimal(0)
RECONCILE_AFTER = timedelta(hours=1)


def _cents(amount: Decimal) -> int:
    return int(amount.quantize(CENTS, rounding=ROUND_HALF_UP) * 100)


# --- the customer ---


def stripe_customer_for(*, tenant: Tenant) -> str:
    """The tenant's Stripe Customer id, created on first need (its key stored first)."""
    with transaction.atomic():
        profile = invoicing.billing_profile_for(tenant=tenant, lock=True)
        if profile.stripe_customer_id:
            return profile.stripe_customer_id
        if not profile.stripe_customer_idempotency_key:
            profile.stripe_customer_idempotency_key = idempotency_key("customer", tenant.pk)
            profile.save(update_fields=["stripe_customer_idempotency_key"])
        key = profile.stripe_customer_idempotency_key
    customer = stripe_call(
        lambda client: client.v1.customers.create(
            params={
                "name": tenant.name,
                "description": f"GpuGeek organisation {tenant.slug}",
                "metadata": {
                    **installation_metadata(),
                    "gpugeek_tenant": str(tenant.pk),
                    "gpugeek_slug": tenant.slug,
                },
            },
            options={"idempotency_key": key},
        )
    )
    TenantBillingProfile.objects.filter(pk=profile.pk, stripe_customer_id="").update(
        stripe_customer_id=customer.id
    )
    return customer.id


# --- the invoice ---


@dataclass(frozen=True)
class PlannedItem:
    what: str  # part of the key: "line:<id>", "tax", "rounding", "credit", "credit-notes"
    description: str
    amount_cents: int
    line_id: int | None = None


def invoice_stripe_items(invoice: Invoice) -> list[PlannedItem]:
    """What the Stripe invoice bills: each line, the tax, the rounding that makes the
    items sum to our total, and what credit and credit notes already took off; their sum
    is our amount due in cents."""
    items = [
        PlannedItem(f"line:{line.pk}", line.description, _cents(line.amount), line.pk)
        for line in invoice.lines.all()
    ]
    if invoice.tax:
        label = f"{invoice.tax_label} {invoice.tax_rate_percent.normalize()}%"
        items.append(PlannedItem("tax", label, _cents(invoice.tax)))
    rounding = _cents(invoice.total) - sum(item.amount_cents for item in items)
    if rounding:
        items.append(PlannedItem("rounding", "Rounding to the cent", rounding))
    if invoice.credits_applied:
        credit = -_cents(invoice.credits_applied)
        items.append(PlannedItem("credit", "Prepaid credit applied", credit))
    credited = invoice.total - invoice.credits_applied - invoice.amount_due
    if credited:
        items.append(PlannedItem("credit-notes", "Credit notes", -_cents(credited)))
    return items


def _plan(invoice: Invoice) -> StripeInvoice:
    """The invoice's Stripe row and its items with their keys, made and committed once."""
    with transaction.atomic():
        locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
        existing = StripeInvoice.objects.filter(invoice=locked).first()
        if existing is not None:
            return existing
        number = locked.number
        pushed = StripeInvoice.objects.create(
            invoice=locked,
            idempotency_key=idempotency_key("invoice", number),
            finalize_idempotency_key=idempotency_key("invoice", number, "finalize"),
        )
        StripeInvoiceItem.objects.bulk_create(
            StripeInvoiceItem(
                stripe_invoice=pushed,
                invoice_line_id=item.line_id,
                description=item.description[:300],
                amount_cents=item.amount_cents,
                idempotency_key=idempotency_key("invoice", number, item.what),
                position=position,
            )
            for position, item in enumerate(invoice_stripe_items(locked))
        )
        # Credit notes made so far are billed by the "Credit notes" item: never sent again.
        StripeCreditNote.objects.bulk_create(
            StripeCreditNote(
                credit_note=note,
                in_invoice=True,
                idempotency_key=idempotency_key("credit-note", note.number),
            )
            for note in locked.credit_notes.all()
        )
    return pushed


def _needs_push(invoice: Invoice) -> bool:
    # Settled by credit at finalization: nothing to collect. Paid, void or uncollectible
    # before it reached Stripe: don't start a Stripe invoice for it now.
    return invoice.status == InvoiceStatus.OPEN and invoice.amount_due > ZERO


def invoice_push(*, invoice: Invoice) -> StripeInvoice | None:
    """Create (or find again, by key) the invoice's items and Stripe invoice and
    finalize it. Without a key, or with nothing to collect, it sends nothing and returns
    the invoice's Stripe row if there is one (else None).

    Raises StripeUnavailable (retry later: the same keys are used) after recording the
    attempt; a refusal (StripeRefused) is recorded and logged, not retried."""
    if not stripe_configured():
        return None
    invoice.refresh_from_db()
    pushed = StripeInvoice.objects.filter(invoice=invoice).first()
    if pushed is not None and pushed.sent_at is not None:
        return pushed  # done already: a duplicate task
    if not _needs_push(invoice):
        return pushed  # a Stripe draft made before it was settled here is never finalized
    pushed = _plan(invoice)
    try:
        _push(invoice, pushed)
    except (StripeUnavailable, StripeRefused) as error:
        StripeInvoice.objects.filter(pk=pushed.pk).update(last_error=str(error)[:500])
        if isinstance(error, StripeUnavailable):
            raise
        log.error("Stripe refused invoice %s: %s", invoice.number, error)
    else:
        StripeInvoice.objects.filter(pk=pushed.pk).update(last_error="")
    pushed.refresh_from_db()
    invoice.refresh_from_db()
    if pushed.sent_at is not None and invoice.status != InvoiceStatus.OPEN:
        invoice_status_push(invoice=invoice)  # voided or paid here while we were finalizing
    return pushed


def _push(invoice: Invoice, pushed: StripeInvoice) -> None:
    StripeInvoice.objects.filter(pk=pushed.pk).update(
        attempts=F("attempts") + 1, last_attempt_at=datetime.now(UTC)
    )
    customer = stripe_customer_for(tenant=invoice.tenant)
    currency = invoice.currency.lower()
    if not pushed.stripe_invoice_id:
        created = stripe_call(
            lambda client: client.v1.invoices.create(
                params={
                    "customer": customer,
                    "currency": currency,
                    "collection_method": "send_invoice",
                    # From our terms, not from the clock: a retry sends the same parameters.
                    "days_until_due": _days_until_due(invoice),
                    "auto_advance": False,  # we finalize it ourselves, once the items are in
                    "pending_invoice_items_behavior": "exclude",
                    "description": (
                        f"GpuGeek invoice {invoice.number}, "
                        f"{invoice.period_start:%Y-%m-%d} – {invoice.period_end:%Y-%m-%d}"
                    ),
                    "metadata": _metadata(invoice),
                },
                options={"idempotency_key": pushed.idempotency_key},
            )
        )
        StripeInvoice.objects.filter(pk=pushed.pk).update(stripe_invoice_id=created.id)
        pushed.stripe_invoice_id = created.id
    for item in pushed.items.filter(stripe_id=""):
        made = _invoice_item_create(invoice, pushed, item, customer=customer, currency=currency)
        StripeInvoiceItem.objects.filter(pk=item.pk).update(stripe_id=made.id)
    invoice.refresh_from_db()
    if not _needs_push(invoice):
        return  # settled here meanwhile: leave the Stripe invoice an unpayable draft
    finalized = stripe_call(
        lambda client: client.v1.invoices.finalize_invoice(
            pushed.stripe_invoice_id,
            params={"auto_advance": False},
            options={"idempotency_key": pushed.finalize_idempotency_key},
        )
    )
    StripeInvoice.objects.filter(pk=pushed.pk).update(
        hosted_invoice_url=finalized.hosted_invoice_url or "",
        sent_at=datetime.now(UTC),
    )


# Our final statuses, carried to Stripe so its invoice can't be paid online any more:
# (Stripe's status for it, the call that gets it there).
STATUS_AT_STRIPE = {
    InvoiceStatus.VOID: ("void", "void"),
    InvoiceStatus.UNCOLLECTIBLE: ("uncollectible", "mark_uncollectible"),
    InvoiceStatus.PAID: ("paid", "pay"),  # paid out of band (a transfer staff recorded)
}


def invoice_status_push(*, invoice: Invoice) -> None:
    """Carry a change made here (staff voided the invoice, marked it uncollectible or
    recorded a payment) to its Stripe invoice. A Stripe invoice already paid or void is
    left alone and logged: a payment that crossed a void needs a refund by staff."""
    if not stripe_configured():
        return
    invoice.refresh_from_db()
    pushed = StripeInvoice.objects.filter(invoice=invoice, sent_at__isnull=False).first()
    if pushed is None or invoice.status not in STATUS_AT_STRIPE:
        return
    target, action = STATUS_AT_STRIPE[InvoiceStatus(invoice.status)]
    stripe_id = pushed.stripe_invoice_id
    current = stripe_call(lambda client: client.v1.invoices.retrieve(stripe_id)).status
    if current == target:
        return
    if current in ("paid", "void"):
        log.error("invoice %s is %s here but %s at Stripe", invoice.number, target, current)
        return
    key = {"idempotency_key": idempotency_key("invoice", invoice.number, action)}
    calls = {
        "void": lambda client: client.v1.invoices.void_invoice(stripe_id, options=key),
        "mark_uncollectible": lambda client: client.v1.invoices.mark_uncollectible(
            stripe_id, options=key
        ),
        "pay": lambda client: client.v1.invoices.pay(
            stripe_id, params={"paid_out_of_band": True}, options=key
        ),
    }
    stripe_call(calls[action])


# --- credit notes ---


class InvoiceNotYetAtStripe(StripeUnavailable):
    """The credit note's invoice is still on its way to Stripe: push the note later."""


def credit_note_push(*, credit_note: CreditNote) -> StripeCreditNote | None:
    """A credit note made after its invoice's Stripe items were planned, created at Stripe
    as a Stripe credit note (once: its key, from our number, is stored first). Notes made
    before are billed by the Stripe invoice itself, and an invoice never pushed (no key,
    nothing to collect) gets none: both return without a call.

    Raises StripeUnavailable (retry later, the same key) while Stripe is unreachable or the
    invoice isn't finalized there yet; a refusal is recorded and logged, not retried."""
    if not stripe_configured():
        return None
    with transaction.atomic():
        # The invoice's lock orders this with `_plan`: either the plan saw the note, or
        # the note's row is made here, after the plan.
        Invoice.objects.select_for_update().get(pk=credit_note.invoice_id)
        pushed_invoice = StripeInvoice.objects.filter(invoice_id=credit_note.invoice_id).first()
        if pushed_invoice is None:
            return None
        pushed, _ = StripeCreditNote.objects.get_or_create(
            credit_note=credit_note,
            defaults={"idempotency_key": idempotency_key("credit-note", credit_note.number)},
        )
    if pushed.in_invoice or pushed.sent_at is not None:
        return pushed
    if pushed_invoice.sent_at is None:
        raise InvoiceNotYetAtStripe(f"{credit_note.invoice} is not finalized at Stripe yet")
    StripeCreditNote.objects.filter(pk=pushed.pk).update(
        attempts=F("attempts") + 1, last_attempt_at=datetime.now(UTC)
    )
    try:
        made = stripe_call(
            lambda client: client.v1.credit_notes.create(
                params=_credit_note_params(credit_note, pushed_invoice),
                options={"idempotency_key": pushed.idempotency_key},
            )
        )
    except (StripeUnavailable, StripeRefused) as error:
        StripeCreditNote.objects.filter(pk=pushed.pk).update(last_error=str(error)[:500])
        if isinstance(error, StripeUnavailable):
            raise
        log.error("Stripe refused credit note %s: %s", credit_note.number, error)
    else:
        StripeCreditNote.objects.filter(pk=pushed.pk).update(
            stripe_credit_note_id=made.id, sent_at=datetime.now(UTC), last_error=""
        )
    pushed.refresh_from_db()
    return pushed


def _credit_note_params(
    note: CreditNote, pushed_invoice: StripeInvoice
) -> stripe.params.CreditNoteCreateParams:
    """Fixed by the note alone, so a retry sends the same parameters. The part that
    reduced the amount due lowers what Stripe collects (a pre-payment note); a note on
    a paid invoice became GpuGeek credit, which Stripe records as credited out of band.
    What exceeded the amount due of an open invoice is GpuGeek credit only: Stripe's
    invoice never billed it."""
    params: stripe.params.CreditNoteCreateParams = {
        "invoice": pushed_invoice.stripe_invoice_id,
        "memo": f"GpuGeek credit note {note.number}: {note.reason}"[:500],
        "metadata": {**_metadata(note.invoice), "gpugeek_credit_note": note.number},
    }
    if note.reduced_amount_due > ZERO:
        params["amount"] = _cents(note.reduced_amount_due)
    else:
        params["amount"] = params["out_of_band_amount"] = _cents(note.total)
    return params


def credit_notes_awaiting_push(*, now: datetime) -> list[int]:
    """Credit notes to send that no push is retrying (like `invoices_awaiting_push`):
    made after their invoice reached Stripe, not sent, not tried in the last hour."""
    if not stripe_configured():
        return []
    quiet = now - RECONCILE_AFTER
    return list(
        CreditNote.objects.filter(invoice__stripe__sent_at__isnull=False)
        .filter(
            Q(stripe__isnull=True, created_at__lt=now - timedelta(minutes=10))
            | Q(stripe__in_invoice=False, stripe__sent_at__isnull=True)
            & (Q(stripe__last_attempt_at__lt=quiet) | Q(stripe__last_attempt_at__isnull=True))
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _invoice_item_create(
    invoice: Invoice,
    pushed: StripeInvoice,
    item: StripeInvoiceItem,
    *,
    customer: str,
    currency: str,
) -> stripe.InvoiceItem:
    return stripe_call(
        lambda client: client.v1.invoice_items.create(
            params={
                "customer": customer,
                "invoice": pushed.stripe_invoice_id,
                "currency": currency,
                "amount": item.amount_cents,
                "description": item.description,
                "metadata": {**_metadata(invoice), "gpugeek_item": item.idempotency_key},
            },
            options={"idempotency_key": item.idempotency_key},
        )
    )


def _days_until_due(invoice: Invoice) -> int:
    if invoice.due_at is None or invoice.finalized_at is None:
        return 1
    return max(1, (invoice.due_at - invoice.finalized_at).days)


def _metadata(invoice: Invoice) -> dict[str, str]:
    return {
        **installation_metadata(),
        "gpugeek_invoice": str(invoice.pk),
        "gpugeek_number": invoice.number or "",
    }


def invoices_awaiting_push(*, now: datetime) -> list[int]:
    """Open invoices with something to collect that haven't reached Stripe and that no
    push is retrying (none tried in the last hour, while the task's backoff waits at most
    30 minutes): the reconciler queues a push for each (a lost task, a broker outage at
    finalization, a key set afterwards, a task that gave up)."""
    if not stripe_configured():
        return []
    quiet = now - RECONCILE_AFTER
    return list(
        Invoice.objects.filter(status=InvoiceStatus.OPEN, amount_due__gt=0)
        .filter(
            Q(stripe__isnull=True, finalized_at__lt=now - timedelta(minutes=10))
            | Q(stripe__sent_at__isnull=True, stripe__last_attempt_at__lt=quiet)
            | Q(stripe__sent_at__isnull=True, stripe__last_attempt_at__isnull=True)
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )
