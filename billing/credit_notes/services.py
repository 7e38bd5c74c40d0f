"""Credit notes: the only correction of a finalized invoice (which is never edited).

A credit note has its own gap-free yearly number (`GGCN-YYYY-NNNNNN`), a mandatory
reason, and lines; its total is at most what is left to credit on the invoice. It first
reduces the invoice's amount due; what exceeds it (the invoice is paid, or credit
already covered it) becomes tenant credit, which the next invoices use.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from billing import tasks
from billing.credit_notes.ledger import credit_balance_move
from billing.invoices.services import billing_profile_for, number_take
from billing.models import (
    CENTS,
    CreditMovementKind,
    CreditNote,
    CreditNoteLine,
    Invoice,
    InvoiceStatus,
    NumberKind,
)
from console.models import User
from console.queueing import enqueue_on_commit
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record

ZERO = Decimal(0)
CREDITABLE = (InvoiceStatus.OPEN, InvoiceStatus.PAID, InvoiceStatus.UNCOLLECTIBLE)


@dataclass(frozen=True)
class CreditLine:
    description: str
    amount: Decimal
    invoice_line_id: int | None = None  # the invoice line it credits, if it names one


def _cents(amount: object, field: str) -> Decimal:
    if not isinstance(amount, Decimal) or not amount.is_finite() or amount <= ZERO:
        raise ServiceError("A credit is a positive amount.", field=field)
    if amount != amount.quantize(CENTS):
        raise ServiceError("A credit is in whole cents.", field=field)
    return amount.quantize(CENTS)


def _check_line_credits(invoice: Invoice, lines: list[CreditLine]) -> None:
    """A credit line tied to an invoice line credits at most what is left of that line
    (its amount less earlier credits of it). The invoice is locked by the caller."""
    asked: dict[int, Decimal] = {}
    for line in lines:
        if line.invoice_line_id is not None:
            asked[line.invoice_line_id] = asked.get(line.invoice_line_id, ZERO) + line.amount
    if not asked:
        return
    invoice_lines = {line.pk: line for line in invoice.lines.filter(pk__in=asked)}
    credited = dict(
        CreditNoteLine.objects.filter(invoice_line_id__in=asked)
        .values("invoice_line")
        .annotate(total=Sum("amount"))
        .values_list("invoice_line", "total")
    )
    for line_id, amount in asked.items():
        invoice_line = invoice_lines.get(line_id)
        if invoice_line is None:
            raise ServiceError(f"{invoice.number} has no line {line_id}.", field="lines")
        left = invoice_line.amount - credited.get(line_id, ZERO)
        if amount > left:
            raise ServiceError(
                f"Only {max(left, ZERO).quantize(CENTS, ROUND_DOWN)} {invoice.currency} is "
                f"left to credit on “{invoice_line.description}”.",
                field="lines",
            )


def credit_note_create(
    *,
    invoice: Invoice,
    reason: str,
    user: User | None,
    amount: Decimal | None = None,
    lines: list[CreditLine] | None = None,
) -> CreditNote:
    """Credit `amount` (one line) or `lines` against a finalized invoice."""
    if not (reason or "").strip():
        raise ServiceError("A credit note needs a reason.", field="reason")
    if (amount is None) == (not lines):
        raise ServiceError("Give either an amount or lines.", field="amount")
    credit_lines = lines or [CreditLine(description=reason.strip(), amount=amount)]  # type: ignore[arg-type]
    parsed = [
        CreditLine(
            description=(line.description or reason).strip()[:300],
            amount=_cents(line.amount, "amount" if amount is not None else "lines"),
            invoice_line_id=line.invoice_line_id,
        )
        for line in credit_lines
    ]
    total = sum((line.amount for line in parsed), ZERO)
    with transaction.atomic():
        profile = billing_profile_for(tenant=invoice.tenant, lock=True)
        locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if locked.status not in CREDITABLE:
            raise ServiceError(
                f"A {locked.get_status_display().lower()} invoice can't be credited.",
                code=ErrorCode.CONFLICT,
            )
        if total > locked.left_to_credit:
            raise ServiceError(
                f"Only {locked.left_to_credit} {locked.currency} is left to credit on "
                f"{locked.number}.",
                field="amount",
            )
        _check_line_credits(locked, parsed)
        reduced = ZERO if locked.status == InvoiceStatus.PAID else min(total, locked.amount_due)
        to_balance = total - reduced
        note = CreditNote.objects.create(
            invoice=locked,
            number=number_take(kind=NumberKind.CREDIT_NOTE, year=timezone.now().year),
            reason=reason.strip(),
            total=total,
            reduced_amount_due=reduced,
            credited_to_balance=to_balance,
            created_by=user,
        )
        CreditNoteLine.objects.bulk_create(
            CreditNoteLine(
                credit_note=note,
                description=line.description,
                amount=line.amount,
                invoice_line_id=line.invoice_line_id,
            )
            for line in parsed
        )
        locked.amount_credited += total
        locked.amount_due -= reduced
        locked.save(update_fields=["amount_credited", "amount_due"])
        if to_balance:
            credit_balance_move(
                profile=profile,
                amount=to_balance,
                kind=CreditMovementKind.CREDIT_NOTE,
                description=f"Credit note {note.number} on {locked.number}",
                invoice=locked,
                credit_note=note,
                user=user,
            )
        if settings.STRIPE_API_KEY:
            # Sent as a Stripe credit note once this commits, if the invoice is at Stripe.
            enqueue_on_commit(tasks.credit_note_push_to_stripe, note.pk)
        audit_record(
            action="invoice.credit_note",
            tenant=locked.tenant,
            actor=user,
            target=locked,
            metadata={"credit_note": note.number, "total": str(total), "reason": note.reason},
        )
    return note
