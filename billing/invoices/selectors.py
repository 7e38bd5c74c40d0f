"""Reads about invoices: who sees which, and the ledger = invoices check."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import DecimalField, OuterRef, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce

from billing.models import (
    AMOUNT_QUANTUM,
    FINALIZED_STATUSES,
    Invoice,
    InvoiceLine,
    LineKind,
    UsageRecord,
)
from console.models import Tenant

ZERO = Decimal(0)


def invoices_visible(
    *, tenant: Tenant | None, staff: bool, tenant_slug: str = ""
) -> QuerySet[Invoice]:
    """Staff: every tenant's (optionally one, by slug); others: their tenant's only."""
    queryset = Invoice.objects.all() if staff else Invoice.objects.for_tenant(tenant)
    if staff and tenant_slug:
        queryset = queryset.filter(tenant__slug=tenant_slug)
    return queryset.select_related("tenant")


@dataclass(frozen=True)
class Mismatch:
    tenant: str
    month: str
    ledger: Decimal
    invoiced: Decimal


def _sum(queryset: QuerySet) -> Subquery:
    """Σ amount of `queryset` (rows of one invoice) as a subquery."""
    return Subquery(
        queryset.order_by().values("invoice").annotate(s=Sum("amount")).values("s")[:1],
        output_field=DecimalField(max_digits=24, decimal_places=9),
    )


def ledger_invoice_mismatches() -> list[Mismatch]:
    """Tenant × month (of the invoice's period) where the ledger records that finalized
    invoices claimed don't sum to those invoices' usage lines. Should always be empty."""
    lines = InvoiceLine.objects.filter(invoice=OuterRef("pk"), kind=LineKind.USAGE)
    records = UsageRecord.objects.filter(invoice=OuterRef("pk"))
    rows = (
        Invoice.objects.filter(status__in=FINALIZED_STATUSES)
        .annotate(
            invoiced=Coalesce(
                _sum(lines), Value(ZERO), output_field=DecimalField(max_digits=24, decimal_places=9)
            ),
            ledger=Coalesce(
                _sum(records),
                Value(ZERO),
                output_field=DecimalField(max_digits=24, decimal_places=9),
            ),
        )
        .values_list("tenant__slug", "period_start", "invoiced", "ledger")
    )
    sums: dict[tuple[str, str], list[Decimal]] = {}
    for slug, start, invoiced, ledger in rows:
        totals = sums.setdefault((slug, f"{start:%Y-%m}"), [ZERO, ZERO])
        # Both are sums of 1e-9 multiples: exact on PostgreSQL; SQLite sums through
        # floats, which quantizing to the ledger's precision undoes.
        totals[0] += ledger.quantize(AMOUNT_QUANTUM)
        totals[1] += invoiced.quantize(AMOUNT_QUANTUM)
    return [
        Mismatch(tenant=slug, month=month, ledger=ledger, invoiced=invoiced)
        for (slug, month), (ledger, invoiced) in sorted(sums.items())
        if ledger != invoiced
    ]
