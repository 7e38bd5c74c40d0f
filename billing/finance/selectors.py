"""Reads of the finance console about invoices: who sees which (`FinanceScope`), the
filtered list with its totals, amounts overdue and their ageing, and each tenant's money
at a glance (the staff's organisations list). Revenue is in `revenue_selectors`.

Whose money: a `FinanceScope` is one tenant (a tenant's finance people, or staff
filtering to one) or every tenant (platform staff only); every query goes through
`scoped`, which reaches tenant data only through `for_tenant` and denies by default.

Money stays Decimal (sums quantized to their column's precision, which also undoes
SQLite's float sums); only the charts turn it into floats.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TypeVar

from django.db.models import Count, Q, QuerySet, Sum

from billing.models import (
    AMOUNT_QUANTUM,
    CENTS,
    Invoice,
    InvoiceStatus,
    TenantBillingProfile,
    UsageDailyTotal,
)
from console.models import Tenant
from console.tenancy import TenantScopedQuerySet

Rows = TypeVar("Rows", bound=TenantScopedQuerySet)
ZERO = Decimal(0)
ONE_DAY = timedelta(days=1)
# Finalized and not void: what was billed.
REVENUE_STATUSES = (InvoiceStatus.OPEN, InvoiceStatus.PAID, InvoiceStatus.UNCOLLECTIBLE)
# (label, first day past due, last day past due or None): days past due are whole days
# since the due date, `(now - due_at).days`.
AGEING_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("0–30 days", 0, 30),
    ("31–60 days", 31, 60),
    ("61–90 days", 61, 90),
    ("over 90 days", 91, None),
)


@dataclass(frozen=True)
class FinanceScope:
    """One tenant's money (`tenant`), or, for platform staff only, every tenant's."""

    tenant: Tenant | None
    staff: bool


def finance_scope(
    *, staff: bool, own_tenant: Tenant | None, tenant: Tenant | None = None
) -> FinanceScope:
    """Staff see every tenant, or the one they filter to; anyone else sees their own
    tenant whatever they ask for."""
    if staff:
        return FinanceScope(tenant=tenant, staff=True)
    return FinanceScope(tenant=own_tenant, staff=False)


def scoped(queryset: Rows, scope: FinanceScope) -> Rows:
    """The rows of `queryset` that `scope` may see: one tenant's, or (staff) all."""
    if scope.tenant is not None:
        return queryset.for_tenant(scope.tenant)
    return queryset if scope.staff else queryset.none()


def month_start(day: date | datetime) -> datetime:
    return datetime(day.year, day.month, 1, tzinfo=UTC)


def next_month(moment: datetime) -> datetime:
    return month_start(moment.replace(day=1) + timedelta(days=32))


def months_between(start: datetime, end: datetime) -> list[str]:
    """Every month that starts in [start, end), as "YYYY-MM"."""
    months, month = [], month_start(start)
    while month < end:
        months.append(f"{month:%Y-%m}")
        month = next_month(month)
    return months


@dataclass(frozen=True)
class InvoiceFilter:
    status: str = ""
    period_from: date | None = None  # invoices whose period starts in this month or later
    period_to: date | None = None  # … in this month or earlier
    overdue: bool = False


def overdue_q(now: datetime) -> Q:
    """Open, past its due date, something left to pay."""
    return Q(status=InvoiceStatus.OPEN, due_at__lt=now, amount_due__gt=0)


def finance_invoices(
    *, scope: FinanceScope, filters: InvoiceFilter, now: datetime
) -> QuerySet[Invoice]:
    invoices = scoped(Invoice.objects.all(), scope).select_related("tenant")
    if filters.status:
        invoices = invoices.filter(status=filters.status)
    if filters.period_from:
        invoices = invoices.filter(period_start__gte=month_start(filters.period_from))
    if filters.period_to:
        invoices = invoices.filter(period_start__lt=next_month(month_start(filters.period_to)))
    if filters.overdue:
        invoices = invoices.filter(overdue_q(now))
    return invoices.order_by("-period_start", "-pk")


@dataclass(frozen=True)
class InvoiceTotals:
    """Totals of a filtered list, per currency. Drafts and void invoices are listed but
    not in `invoiced`; `amount_due` is what open invoices still ask for; `paid` is what
    paid invoices asked for after credit (what was collected)."""

    currency: str
    count: int
    invoiced: Decimal
    amount_due: Decimal
    overdue: Decimal
    paid: Decimal


def invoice_totals(invoices: QuerySet[Invoice], *, now: datetime) -> list[InvoiceTotals]:
    rows = (
        invoices.order_by()
        .values("currency")
        .annotate(
            n=Count("pk"),
            sum_invoiced=Sum("total", filter=Q(status__in=REVENUE_STATUSES)),
            sum_due=Sum("amount_due", filter=Q(status=InvoiceStatus.OPEN)),
            sum_overdue=Sum("amount_due", filter=overdue_q(now)),
            sum_paid=Sum("amount_due", filter=Q(status=InvoiceStatus.PAID)),
        )
        .order_by("currency")
    )

    def cents(value: Decimal | None) -> Decimal:
        return (value or ZERO).quantize(CENTS)

    return [
        InvoiceTotals(
            currency=row["currency"],
            count=row["n"],
            invoiced=cents(row["sum_invoiced"]),
            amount_due=cents(row["sum_due"]),
            overdue=cents(row["sum_overdue"]),
            paid=cents(row["sum_paid"]),
        )
        for row in rows
    ]


def days_past_due(invoice: Invoice, *, now: datetime) -> int | None:
    if invoice.status != InvoiceStatus.OPEN or invoice.due_at is None or invoice.due_at >= now:
        return None
    return (now - invoice.due_at).days


@dataclass(frozen=True)
class AgeingBucket:
    label: str
    amount: Decimal
    count: int


@dataclass(frozen=True)
class Ageing:
    """Open invoices' amounts due as of `now`, in one currency: past due by bucket, and
    not yet due. Uncollectible invoices are written off and not counted."""

    currency: str
    buckets: list[AgeingBucket]
    not_yet_due: Decimal
    open_count: int

    @property
    def overdue(self) -> Decimal:
        return sum((bucket.amount for bucket in self.buckets), ZERO)

    @property
    def overdue_count(self) -> int:
        return sum(bucket.count for bucket in self.buckets)


def ageing_bucket(days: int) -> int:
    """The index in AGEING_BUCKETS of an amount `days` past due (days ≥ 0)."""
    for position, (_label, first, last) in enumerate(AGEING_BUCKETS):
        if days >= first and (last is None or days <= last):
            return position
    raise ValueError(f"{days} days past due is not overdue")


def invoice_ageing(*, scope: FinanceScope, now: datetime, currency: str) -> Ageing:
    amounts = [ZERO] * len(AGEING_BUCKETS)
    counts = [0] * len(AGEING_BUCKETS)
    not_yet_due, open_count = ZERO, 0
    rows = (
        scoped(Invoice.objects.all(), scope)
        .filter(status=InvoiceStatus.OPEN, amount_due__gt=0, currency=currency)
        .values_list("due_at", "amount_due")
    )
    for due_at, amount_due in rows:
        open_count += 1
        if due_at is None or due_at >= now:
            not_yet_due += amount_due
            continue
        position = ageing_bucket((now - due_at).days)
        amounts[position] += amount_due
        counts[position] += 1
    return Ageing(
        currency=currency,
        buckets=[
            AgeingBucket(label=label, amount=amounts[i], count=counts[i])
            for i, (label, _first, _last) in enumerate(AGEING_BUCKETS)
        ],
        not_yet_due=not_yet_due,
        open_count=open_count,
    )


@dataclass(frozen=True)
class TenantMoney:
    """Month-to-date spend (the ledger, per currency), balance due (open invoices, per
    currency) and credit balance of one tenant."""

    mtd_spend: dict[str, Decimal]
    balance_due: dict[str, Decimal]
    credit: Decimal


def tenant_money(*, tenant_ids: list[int], now: datetime) -> dict[int, TenantMoney]:
    """Three grouped queries for any number of tenants (staff only: no tenant scope)."""
    spend: dict[int, dict[str, Decimal]] = defaultdict(dict)
    for tenant_id, currency, amount in (
        UsageDailyTotal.objects.filter(tenant_id__in=tenant_ids, bucket_start__gte=month_start(now))
        .values("tenant_id", "currency")
        .annotate(s=Sum("amount"))
        .values_list("tenant_id", "currency", "s")
        .order_by()
    ):
        spend[tenant_id][currency] = (amount or ZERO).quantize(AMOUNT_QUANTUM)
    due: dict[int, dict[str, Decimal]] = defaultdict(dict)
    for tenant_id, currency, amount in (
        Invoice.objects.filter(tenant_id__in=tenant_ids, status=InvoiceStatus.OPEN)
        .values("tenant_id", "currency")
        .annotate(s=Sum("amount_due"))
        .values_list("tenant_id", "currency", "s")
        .order_by()
    ):
        due[tenant_id][currency] = (amount or ZERO).quantize(CENTS)
    credit = dict(
        TenantBillingProfile.objects.filter(tenant_id__in=tenant_ids).values_list(
            "tenant_id", "credit_balance"
        )
    )
    return {
        tenant_id: TenantMoney(
            mtd_spend=spend.get(tenant_id, {}),
            balance_due=due.get(tenant_id, {}),
            credit=credit.get(tenant_id, ZERO),
        )
        for tenant_id in tenant_ids
    }
