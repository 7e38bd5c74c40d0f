"""Invoices from the ledger: drafts, adjustments, finalization and the invoice lifecycle.

Invariants (DESIGN.md, "Money path"):
- Usage lines are sums of ledger records, at the ledger's precision. A draft shows the
  tenant's unclaimed records; finalizing recomputes its usage lines from the records it
  claims (`UsageRecord.invoice`) in the same transaction, so a finalized invoice's usage
  equals exactly the records that point at it, and a record is billed at most once.
- A finalized invoice claims the unclaimed records of its period and any unclaimed
  records that arrived late for a period an earlier finalized invoice covers (a late
  metering tick): late usage goes to the next invoice, never into a finalized one.
- The ledger records discounted prices (`UsageRecord.unit_price` is after the tenant's
  discount, `discount_percent` says which), so usage lines are at the price charged and
  the discount is shown beside them (`Invoice.discount`), not subtracted again.
- The total is rounded to the cent once; `rounding` shows the difference.
- Numbers come from a gap-free yearly sequence taken under a row lock in the finalizing
  transaction. Lock order: the tenant's billing profile, the invoice, the sequence row.
- Voiding releases nothing: a voided invoice keeps its claim, so its usage is not billed
  again automatically (staff re-bill it with an adjustment on a new invoice if needed).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import reduce
from operator import or_

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, QuerySet, Sum

from billing import tasks
from billing.credit_notes.ledger import credit_balance_move
from billing.invoices.redone import line_key, redone_gpu_seconds
from billing.metering.storage import STORAGE_TIER
from billing.models import (
    AMOUNT_QUANTUM,
    CENTS,
    FINALIZED_STATUSES,
    HOURS_QUANTUM,
    NUMBER_PREFIX,
    CreditMovementKind,
    Invoice,
    InvoiceLine,
    InvoiceNumberSequence,
    InvoiceStatus,
    LineKind,
    NumberKind,
    TenantBillingProfile,
    UsageDailyTotal,
    UsageRecord,
)
from console.models import Tenant, User
from console.queueing import enqueue_on_commit
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record

ZERO = Decimal(0)
HUNDRED = Decimal(100)
SECONDS_PER_HOUR = Decimal(3600)
TIER_LABELS = {"on_demand": "on-demand", "service": "service replicas"}


def billing_profile_for(*, tenant: Tenant, lock: bool = False) -> TenantBillingProfile:
    """The tenant's billing profile, made on first need; `lock` takes its row lock (the
    per-tenant invoicing lock)."""
    TenantBillingProfile.objects.bulk_create(
        [TenantBillingProfile(tenant=tenant)], ignore_conflicts=True
    )
    queryset = TenantBillingProfile.objects.all()
    if lock:
        queryset = queryset.select_for_update()
    return queryset.get(tenant=tenant)


def number_take(*, kind: NumberKind, year: int) -> str:
    """The next number of the gap-free `kind` sequence of `year`; call inside the
    transaction that uses it (the row stays locked until it ends)."""
    InvoiceNumberSequence.objects.bulk_create(
        [InvoiceNumberSequence(kind=kind, year=year)], ignore_conflicts=True
    )
    sequence = InvoiceNumberSequence.objects.select_for_update().get(kind=kind, year=year)
    sequence.last += 1
    sequence.save(update_fields=["last"])
    return f"{NUMBER_PREFIX[kind]}-{year}-{sequence.last:06d}"


# --- what the ledger says ---


def _late_periods(*, tenant: Tenant, before: datetime, exclude: Invoice | None) -> Q | None:
    """Periods, ending by `before`, that finalized invoices of the tenant cover: their
    unclaimed records arrived late and go to the next invoice."""
    finalized = Invoice.objects.for_tenant(tenant).filter(
        status__in=FINALIZED_STATUSES, period_end__lte=before
    )
    if exclude is not None:
        finalized = finalized.exclude(pk=exclude.pk)
    ranges = [
        Q(interval_start__gte=start, interval_start__lt=end)
        for start, end in finalized.values_list("period_start", "period_end")
    ]
    return reduce(or_, ranges) if ranges else None


def billable_records(
    *, tenant: Tenant, period_start: datetime, period_end: datetime, invoice: Invoice | None = None
) -> QuerySet[UsageRecord]:
    """The unclaimed records an invoice of this period bills: its period's, and late ones
    for periods already invoiced."""
    in_period = Q(interval_start__gte=period_start, interval_start__lt=period_end)
    late = _late_periods(tenant=tenant, before=period_start, exclude=invoice)
    return UsageRecord.objects.for_tenant(tenant).filter(
        (in_period | late) if late is not None else in_period, invoice__isnull=True
    )


@dataclass(frozen=True)
class UsageLine:
    description: str
    gpu_type: str
    tier: str
    region: str
    quantity: Decimal
    unit: str
    unit_price: Decimal
    amount: Decimal
    price_version_id: int | None
    discount: Decimal  # what the negotiated discount took off `amount` (shown only)
    currency: str
    # GPU-seconds of it spent redoing work lost to preemption (billing.invoices.redone).
    redone_gpu_seconds: Decimal | None = None


def usage_lines(records: QuerySet[UsageRecord], *, period_start: datetime) -> list[UsageLine]:
    """One line per GPU type (or CPU) × tier × region × price charged (two price versions
    are two lines; usage metered late for an earlier period is its own line)."""
    rows = (
        records.annotate(late=Q(interval_start__lt=period_start))
        .values(
            "gpu_type__slug",
            "gpu_type__model",
            "tier",
            "region__slug",
            "price_version_id",
            "unit_price",
            "discount_percent",
            "currency",
            "late",
        )
        .annotate(
            gpu_seconds=Sum("gpu_seconds"),
            cpu_seconds=Sum("cpu_seconds"),
            amount=Sum("amount"),
            records=Count("pk"),
        )
        .order_by("gpu_type__slug", "tier", "region__slug", "price_version_id", "unit_price")
    )
    redone = redone_gpu_seconds(records, period_start=period_start)
    lines = []
    for row in rows:
        is_gpu = row["gpu_type__slug"] is not None
        is_storage = row["tier"] == STORAGE_TIER
        seconds = row["gpu_seconds"] if is_gpu else row["cpu_seconds"]
        what = row["gpu_type__model"] if is_gpu else "Volume storage" if is_storage else "CPU"
        tier = TIER_LABELS.get(row["tier"], row["tier"])
        description = " · ".join([what, *([] if is_storage else [tier]), row["region__slug"]])
        if row["late"]:
            description += " · metered late for an earlier period"
        lost = redone.get(line_key(row))
        if lost:
            description += (
                f" · incl. {lost.quantize(Decimal(1), ROUND_HALF_UP):,} GPU-seconds redone"
                " after preemption (since the last checkpoint)"
            )
        percent = row["discount_percent"]
        amount = row["amount"].quantize(AMOUNT_QUANTUM)
        discount = ZERO
        if ZERO < percent < HUNDRED:
            discount = (amount * percent / (HUNDRED - percent)).quantize(AMOUNT_QUANTUM)
        quantity = (seconds / SECONDS_PER_HOUR).quantize(HOURS_QUANTUM)
        if is_storage:  # GiB-hours: the records' size × hours, at the line's one price
            unit_price = row["unit_price"]
            quantity = (amount / unit_price).quantize(HOURS_QUANTUM) if unit_price else ZERO
        lines.append(
            UsageLine(
                description=description,
                gpu_type=row["gpu_type__slug"] or ("storage" if is_storage else "cpu"),
                tier=row["tier"],
                region=row["region__slug"],
                quantity=quantity,
                unit="GPU-hour" if is_gpu else "GiB-hour" if is_storage else "vCPU-hour",
                unit_price=row["unit_price"],
                amount=amount,
                price_version_id=row["price_version_id"],
                discount=discount,
                currency=row["currency"],
                redone_gpu_seconds=lost,
            )
        )
    return lines


def _write_usage_lines(invoice: Invoice, lines: list[UsageLine]) -> None:
    currencies = {line.currency for line in lines}
    if len(currencies) > 1:
        raise ServiceError(
            f"The period has usage in several currencies ({', '.join(sorted(currencies))}).",
            code=ErrorCode.CONFLICT,
        )
    invoice.lines.filter(kind__in=[LineKind.USAGE, LineKind.DISCOUNT]).delete()
    InvoiceLine.objects.bulk_create(
        InvoiceLine(
            invoice=invoice,
            kind=LineKind.USAGE,
            description=line.description,
            gpu_type=line.gpu_type,
            tier=line.tier,
            region=line.region,
            quantity=line.quantity,
            unit=line.unit,
            unit_price=line.unit_price,
            amount=line.amount,
            price_version_id=line.price_version_id,
            redone_gpu_seconds=line.redone_gpu_seconds,
            position=position,
        )
        for position, line in enumerate(lines)
    )
    if currencies:
        invoice.currency = currencies.pop()
    invoice.discount = sum((line.discount for line in lines), ZERO)


def _totals(invoice: Invoice, profile: TenantBillingProfile, *, apply_credit: bool) -> None:
    """Subtotal, tax and the total rounded to the cent once; then credit and amount due."""
    invoice.subtotal = invoice.lines.aggregate(s=Sum("amount"))["s"] or ZERO
    invoice.tax_rate_percent = profile.tax_rate_percent
    invoice.tax_label = profile.tax_label
    invoice.tax = (invoice.subtotal * profile.tax_rate_percent / HUNDRED).quantize(AMOUNT_QUANTUM)
    exact = invoice.subtotal + invoice.tax
    invoice.total = exact.quantize(CENTS, rounding=ROUND_HALF_UP)
    invoice.rounding = invoice.total - exact
    # A draft shows the credit it would use; finalizing takes it from the balance.
    credits = min(profile.credit_balance, max(invoice.total, ZERO))
    invoice.credits_applied = credits
    invoice.amount_due = invoice.total - credits - invoice.amount_credited
    if apply_credit and credits:
        credit_balance_move(
            profile=profile,
            amount=-credits,
            kind=CreditMovementKind.INVOICE,
            description="Used by an invoice at its finalization",
            invoice=invoice,
        )


# --- drafts ---


def _check_period(period_start: datetime, period_end: datetime) -> None:
    if period_end <= period_start:
        raise ServiceError("The period must end after it starts.", field="period_end")


def _overlapping(*, tenant: Tenant, period_start: datetime, period_end: datetime) -> bool:
    return (
        Invoice.objects.for_tenant(tenant)
        .exclude(status=InvoiceStatus.VOID)
        .filter(period_start__lt=period_end, period_end__gt=period_start)
        .exists()
    )


def invoice_draft_create(
    *, tenant: Tenant, period_start: datetime, period_end: datetime, user: User | None = None
) -> Invoice:
    """A draft for `[period_start, period_end)`; 409 if an invoice (not void) of the
    tenant already covers part of it."""
    _check_period(period_start, period_end)
    with transaction.atomic():
        profile = billing_profile_for(tenant=tenant, lock=True)
        if _overlapping(tenant=tenant, period_start=period_start, period_end=period_end):
            raise ServiceError(
                "An invoice of this organisation already covers part of this period.",
                code=ErrorCode.CONFLICT,
            )
        invoice = Invoice.objects.create(
            tenant=tenant, period_start=period_start, period_end=period_end, created_by=user
        )
        records = billable_records(tenant=tenant, period_start=period_start, period_end=period_end)
        _write_usage_lines(invoice, usage_lines(records, period_start=period_start))
        _totals(invoice, profile, apply_credit=False)
        invoice.save()
        audit_record(
            action="invoice.draft_create",
            tenant=tenant,
            actor=user,
            target=invoice,
            metadata={
                "period_start": period_start.isoformat(),
                "period_end": period_end.isoformat(),
            },
        )
    return invoice


def previous_month(now: datetime) -> tuple[datetime, datetime]:
    end = datetime(now.year, now.month, 1, tzinfo=UTC)
    start = (end - timedelta(days=1)).replace(day=1)
    return start, end


def invoices_draft_monthly(*, now: datetime) -> list[Invoice]:
    """Drafts of last month for every tenant with usage in it (run on the 1st; running it
    again makes nothing new: a tenant whose month is already invoiced is skipped)."""
    start, end = previous_month(now)
    # The daily totals say who had usage without scanning the ledger.
    tenant_ids = (
        UsageDailyTotal.objects.filter(bucket_start__gte=start, bucket_start__lt=end)
        .values_list("tenant_id", flat=True)
        .distinct()
    )
    drafts = []
    for tenant in Tenant.objects.filter(pk__in=list(tenant_ids)).order_by("pk"):
        if _overlapping(tenant=tenant, period_start=start, period_end=end):
            continue
        try:
            drafts.append(invoice_draft_create(tenant=tenant, period_start=start, period_end=end))
        except ServiceError as error:
            if error.code != ErrorCode.CONFLICT:  # made meanwhile by a concurrent run: done
                raise
    return drafts


def _locked_draft(invoice: Invoice) -> tuple[TenantBillingProfile, Invoice]:
    profile = billing_profile_for(tenant=invoice.tenant, lock=True)
    locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if locked.status != InvoiceStatus.DRAFT:
        raise ServiceError(
            f"Invoice {locked} is {locked.get_status_display().lower()}, not a draft.",
            code=ErrorCode.CONFLICT,
        )
    return profile, locked


def invoice_adjustment_add(
    *, invoice: Invoice, description: str, amount: Decimal, reason: str, user: User | None
) -> InvoiceLine:
    """A line staff add to a draft (positive: a charge, negative: a goodwill credit)."""
    if not (reason or "").strip():
        raise ServiceError("An adjustment needs a reason.", field="reason")
    if not isinstance(amount, Decimal) or not amount.is_finite() or amount == ZERO:
        raise ServiceError("An adjustment needs a non-zero amount.", field="amount")
    with transaction.atomic():
        profile, locked = _locked_draft(invoice)
        line = InvoiceLine.objects.create(
            invoice=locked,
            kind=LineKind.ADJUSTMENT,
            description=(description or "").strip() or reason.strip(),
            amount=amount.quantize(AMOUNT_QUANTUM),
            reason=reason.strip(),
            position=10_000 + locked.lines.count(),
        )
        _totals(locked, profile, apply_credit=False)
        locked.save()
        audit_record(
            action="invoice.adjustment_add",
            tenant=locked.tenant,
            actor=user,
            target=locked,
            metadata={"amount": str(line.amount), "reason": line.reason},
        )
    invoice.refresh_from_db()
    return line


def invoice_draft_delete(*, invoice: Invoice, user: User | None) -> None:
    with transaction.atomic():
        _profile, locked = _locked_draft(invoice)
        audit_record(
            action="invoice.draft_delete",
            tenant=locked.tenant,
            actor=user,
            target=locked,
            metadata={"period_start": locked.period_start.isoformat()},
        )
        locked.delete()


def invoice_finalize(
    *, invoice: Invoice, user: User | None, now: datetime | None = None
) -> Invoice:
    """Draft → open in one transaction: claim the unclaimed records, recompute the usage
    lines from exactly those, take the next number of the year, set the due date."""
    now = now or datetime.now(UTC)
    with transaction.atomic():
        profile, locked = _locked_draft(invoice)
        records = billable_records(
            tenant=locked.tenant,
            period_start=locked.period_start,
            period_end=locked.period_end,
            invoice=locked,
        )
        # One UPDATE claims what is committed now; records committed later stay for the
        # next invoice. The lines are then read from the claim itself.
        records.update(invoice=locked)
        claimed = UsageRecord.objects.filter(invoice=locked)
        _write_usage_lines(locked, usage_lines(claimed, period_start=locked.period_start))
        if not locked.lines.exists():
            raise ServiceError("This draft has no lines: there is nothing to invoice.")
        _totals(locked, profile, apply_credit=True)
        locked.number = number_take(kind=NumberKind.INVOICE, year=now.year)
        locked.status = InvoiceStatus.OPEN
        locked.finalized_at = now
        locked.due_at = now + timedelta(days=profile.payment_terms_days)
        if locked.amount_due <= ZERO:
            locked.status, locked.paid_at = InvoiceStatus.PAID, now  # settled by credit
        elif settings.STRIPE_API_KEY:
            # Pushed to Stripe once this commits (by name: services don't import tasks).
            enqueue_on_commit(tasks.invoice_push_to_stripe, locked.pk)
        locked.save()
        audit_record(
            action="invoice.finalize",
            tenant=locked.tenant,
            actor=user,
            target=locked,
            metadata={"number": locked.number, "total": str(locked.total)},
        )
    return locked


# --- after finalization: forward-only transitions ---

TRANSITIONS: dict[str, set[str]] = {
    InvoiceStatus.OPEN: {InvoiceStatus.PAID, InvoiceStatus.VOID, InvoiceStatus.UNCOLLECTIBLE},
    InvoiceStatus.UNCOLLECTIBLE: {InvoiceStatus.PAID},
}


def invoice_status_change(
    *,
    invoice: Invoice,
    to: InvoiceStatus,
    user: User | None,
    now: datetime | None = None,
    via: str = "",
    reference: str = "",
) -> Invoice:
    """Move an open invoice forward: paid, void or uncollectible (anything else: 409). A
    voided invoice's records stay claimed (see the module doc). `via` names the system
    that reported the change when no user made it ("stripe"), `reference` what it reported
    it with (an event id); both go to the audit log."""
    now = now or datetime.now(UTC)
    with transaction.atomic():
        locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if to not in TRANSITIONS.get(locked.status, set()):
            raise ServiceError(
                f"A {locked.get_status_display().lower()} invoice can't become {to.label.lower()}.",
                code=ErrorCode.CONFLICT,
            )
        previous, locked.status = locked.status, to
        if to == InvoiceStatus.PAID:
            locked.paid_at = now
        elif to == InvoiceStatus.VOID:
            locked.voided_at = now
        locked.save(update_fields=["status", "paid_at", "voided_at"])
        metadata = {"from": previous, "number": locked.number}
        if via:
            metadata.update(via=via, reference=reference)
        elif settings.STRIPE_API_KEY:
            # Decided here, not reported by Stripe: its copy must follow, so it can't be
            # paid online any more.
            enqueue_on_commit(tasks.invoice_status_to_stripe, locked.pk)
        audit_record(
            action=f"invoice.{to.value}",
            tenant=locked.tenant,
            actor=user,
            actor_label=None if user else (via or None),
            target=locked,
            metadata=metadata,
        )
    return locked


def invoice_can_become(invoice: Invoice, to: InvoiceStatus) -> bool:
    """Whether `to` is a legal (forward) transition from the invoice's status."""
    return to in TRANSITIONS.get(invoice.status, set())


def invoice_payment_failure_record(
    *, invoice: Invoice, message: str, via: str, reference: str = "", now: datetime | None = None
) -> bool:
    """Record a failed collection attempt on an open invoice (shown on its page and the
    tenant's dashboard until it is paid). Anything but open: nothing to record, False."""
    now = now or datetime.now(UTC)
    with transaction.atomic():
        locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if locked.status != InvoiceStatus.OPEN:
            return False
        locked.payment_failed_at = now
        locked.payment_failure_message = message[:500]
        locked.save(update_fields=["payment_failed_at", "payment_failure_message"])
        audit_record(
            action="invoice.payment_failed",
            tenant=locked.tenant,
            actor_label=via,
            target=locked,
            metadata={"number": locked.number, "message": locked.payment_failure_message,
                      "via": via, "reference": reference},
        )  # fmt: skip
    return True
