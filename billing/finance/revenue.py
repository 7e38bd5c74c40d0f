"""Reads of the finance console's revenue dashboard: revenue by month, GPU type and
tier, GPU-hours sold, utilisation of the pools, top tenants; in the scope of
`finance_selectors.FinanceScope`.

Revenue comes from invoices where they exist, else from the ledger: a tenant's usage on
a day that one of its finalized invoices covers counts through that invoice's usage
lines (in the month its period starts; void invoices bill nothing, so their days count
nothing), and usage on days no finalized invoice covers yet counts from the ledger's
daily totals. Invoice periods are whole days (midnight UTC), so a day is covered or not.
GPU-hours and utilisation are what ran, so they always come from the ledger.

Money stays Decimal at the ledger's precision (sums quantized to AMOUNT_QUANTUM, which
also undoes SQLite's float sums); only the charts turn it into floats.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Exists, F, OuterRef, QuerySet, Sum
from django.db.models.functions import TruncMonth

from billing.charts import TIER_LABELS
from billing.finance.selectors import (
    REVENUE_STATUSES,
    ZERO,
    Ageing,
    FinanceScope,
    invoice_ageing,
    months_between,
    scoped,
)
from billing.models import (
    AMOUNT_QUANTUM,
    FINALIZED_STATUSES,
    HOURS_QUANTUM,
    Invoice,
    InvoiceLine,
    LineKind,
    UsageDailyTotal,
)
from console.models import Tenant
from marketplace.models import GpuType, NodePool

HOUR_SECONDS = Decimal(3600)
PERCENT_QUANTUM = Decimal("0.01")
INVOICED, LEDGER = "invoiced", "ledger"
TOP_TENANTS = 10


@dataclass(frozen=True)
class RevenueRow:
    """Revenue summed over some of month ("YYYY-MM"), tenant, GPU type and tier (left
    empty where not asked for), in one currency, from one source."""

    source: str
    currency: str
    amount: Decimal
    month: str = ""
    tenant_id: int = 0
    gpu_type: str = ""
    tier: str = ""


def _ledger_dimensions() -> dict[str, Any]:
    return {
        "month": TruncMonth("bucket_start", tzinfo=UTC),
        "tenant_id": F("tenant_id"),
        "gpu_type": F("gpu_type"),
        "tier": F("tier"),
        "currency": F("currency"),
    }


def _invoice_dimensions() -> dict[str, Any]:
    return {
        "month": TruncMonth("invoice__period_start", tzinfo=UTC),
        "tenant_id": F("invoice__tenant_id"),
        "gpu_type": F("gpu_type"),
        "tier": F("tier"),
        "currency": F("invoice__currency"),
    }


def _grouped(queryset: QuerySet, expressions: dict[str, Any], dimensions: Iterable[str]):
    names = [*dimensions, "currency"]
    keyed = queryset.annotate(**{f"k_{name}": expressions[name] for name in names})
    return keyed.values(*[f"k_{name}" for name in names]).annotate(s=Sum("amount")).order_by()


def uninvoiced_daily_totals(
    *, scope: FinanceScope, start: datetime, end: datetime
) -> QuerySet[UsageDailyTotal]:
    """The ledger's daily totals in [start, end) on days no finalized invoice of their
    tenant covers (those count through the invoice)."""
    covered = Invoice.objects.filter(
        tenant=OuterRef("tenant"),
        status__in=FINALIZED_STATUSES,
        period_start__lte=OuterRef("bucket_start"),
        period_end__gt=OuterRef("bucket_start"),
    )
    return (
        scoped(UsageDailyTotal.objects.all(), scope)
        .filter(bucket_start__gte=start, bucket_start__lt=end)
        .filter(~Exists(covered))
    )


def invoiced_usage_lines(
    *, scope: FinanceScope, start: datetime, end: datetime
) -> QuerySet[InvoiceLine]:
    """Usage lines of the finalized, not void invoices whose period starts in [start, end)."""
    return scoped(InvoiceLine.objects.all(), scope).filter(
        kind=LineKind.USAGE,
        invoice__status__in=REVENUE_STATUSES,
        invoice__period_start__gte=start,
        invoice__period_start__lt=end,
    )


def revenue_rows(
    *, scope: FinanceScope, start: datetime, end: datetime, dimensions: Iterable[str]
) -> list[RevenueRow]:
    """Revenue in [start, end) by `dimensions` (of month, tenant_id, gpu_type, tier) and
    currency: one grouped query over invoices' usage lines, one over the daily totals."""
    dimensions = list(dimensions)
    rows = []
    sources = (
        (INVOICED, invoiced_usage_lines(scope=scope, start=start, end=end), _invoice_dimensions()),
        (LEDGER, uninvoiced_daily_totals(scope=scope, start=start, end=end), _ledger_dimensions()),
    )
    for source, queryset, expressions in sources:
        for row in _grouped(queryset, expressions, dimensions):
            keys = {name: row[f"k_{name}"] for name in dimensions}
            if "month" in keys:
                keys["month"] = f"{keys['month']:%Y-%m}"
            rows.append(
                RevenueRow(
                    source=source,
                    currency=row["k_currency"],
                    amount=(row["s"] or ZERO).quantize(AMOUNT_QUANTUM),
                    **keys,
                )
            )
    return rows


def gpu_type_labels(slugs: Iterable[str]) -> dict[str, str]:
    """Display names of GPU type slugs (the ledger's keys); "cpu" is CPU usage."""
    names = dict(GpuType.objects.filter(slug__in=set(slugs)).values_list("slug", "model"))
    return {slug: "CPU" if slug == "cpu" else names.get(slug, slug) for slug in slugs}


def _series(
    rows: Iterable[RevenueRow], months: list[str], key: str, labels: dict[str, str]
) -> dict[str, list[Decimal]]:
    index = {month: i for i, month in enumerate(months)}
    series: dict[str, list[Decimal]] = defaultdict(lambda: [ZERO] * len(months))
    for row in rows:
        value = getattr(row, key)
        series[labels.get(value, value)][index[row.month]] += row.amount
    return dict(sorted(series.items()))


@dataclass(frozen=True)
class MonthSource:
    month: str
    invoiced: Decimal
    ledger: Decimal

    @property
    def total(self) -> Decimal:
        return self.invoiced + self.ledger


@dataclass(frozen=True)
class PoolUtilisation:
    """GPU-hours sold on one pool group (GPU type × region × tier: what the ledger knows
    of a pool) against its capacity now (Σ total GPUs × hours in the period)."""

    label: str
    pools: str
    gpu_hours_sold: Decimal
    capacity_gpu_hours: Decimal | None  # None: no active pool offers it now
    percent: Decimal | None


@dataclass(frozen=True)
class TenantRevenue:
    name: str
    slug: str
    amount: Decimal


def _hours(seconds: Decimal) -> Decimal:
    return (seconds / HOUR_SECONDS).quantize(HOURS_QUANTUM)


def gpu_hours_sold(
    *, scope: FinanceScope, start: datetime, end: datetime, months: list[str]
) -> dict[str, list[Decimal]]:
    """GPU-hours in the ledger per GPU type and month (CPU usage is not GPU-hours)."""
    rows = (
        scoped(UsageDailyTotal.objects.all(), scope)
        .filter(bucket_start__gte=start, bucket_start__lt=end)
        .exclude(gpu_type="cpu")
        .annotate(month=TruncMonth("bucket_start", tzinfo=UTC))
        .values("month", "gpu_type")
        .annotate(seconds=Sum("gpu_seconds"))
        .order_by()
    )
    cells = [(f"{row['month']:%Y-%m}", row["gpu_type"], row["seconds"]) for row in rows]
    labels = gpu_type_labels({gpu_type for _, gpu_type, _ in cells})
    index = {month: i for i, month in enumerate(months)}
    seconds: dict[str, list[Decimal]] = defaultdict(lambda: [ZERO] * len(months))
    for month, gpu_type, value in cells:
        seconds[labels[gpu_type]][index[month]] += value or ZERO
    return {label: [_hours(s) for s in values] for label, values in sorted(seconds.items())}


def pool_utilisation(
    *, scope: FinanceScope, start: datetime, end: datetime, now: datetime
) -> list[PoolUtilisation]:
    """Per pool group: GPU-hours sold in [start, min(end, now)) ÷ (its pools' total GPUs
    now × the hours of that period). An approximation: capacity is today's, not what the
    pools had over the period. A tenant sees only the pool groups it used."""
    until = min(end, now)
    hours = Decimal((until - start).total_seconds()) / HOUR_SECONDS if until > start else ZERO
    sold: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
    for row in (
        scoped(UsageDailyTotal.objects.all(), scope)
        .filter(bucket_start__gte=start, bucket_start__lt=until)
        .exclude(gpu_type="cpu")
        .values("gpu_type", "region", "tier")
        .annotate(seconds=Sum("gpu_seconds"))
        .order_by()
    ):
        sold[(row["gpu_type"], row["region"], row["tier"])] += row["seconds"] or ZERO
    capacity: dict[tuple[str, str, str], int] = defaultdict(int)
    names: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for slug, region, tier, total_gpus, name in NodePool.objects.filter(
        is_active=True, total_gpus__gt=0, gpu_type__isnull=False
    ).values_list("gpu_type__slug", "region__slug", "tier", "total_gpus", "name"):
        key = (slug, region, tier)
        if scope.tenant is None or key in sold:
            capacity[key] += total_gpus
            names[key].append(name)
    labels = gpu_type_labels({key[0] for key in [*sold, *capacity]})
    result = []
    for key in sorted(set(sold) | set(capacity)):
        gpu_type, region, tier = key
        sold_hours = _hours(sold.get(key, ZERO))
        capacity_hours = (
            (capacity[key] * hours).quantize(HOURS_QUANTUM) if key in capacity else None
        )
        percent = (
            (sold_hours * 100 / capacity_hours).quantize(PERCENT_QUANTUM)
            if capacity_hours
            else None
        )
        result.append(
            PoolUtilisation(
                label=f"{labels[gpu_type]} · {region} · {TIER_LABELS.get(tier, tier)}",
                pools=", ".join(sorted(names.get(key, []))),
                gpu_hours_sold=sold_hours,
                capacity_gpu_hours=capacity_hours,
                percent=percent,
            )
        )
    return result


@dataclass(frozen=True)
class RevenueDashboard:
    """Everything the revenue page shows for one scope, period and currency."""

    start: datetime
    end: datetime
    currency: str
    other_currencies: dict[str, Decimal]
    months: list[str]
    by_month: list[MonthSource]
    by_gpu_type: dict[str, list[Decimal]]
    by_tier: dict[str, list[Decimal]]
    tier_totals: dict[str, Decimal]
    gpu_hours: dict[str, list[Decimal]]
    utilisation: list[PoolUtilisation]
    ageing: Ageing
    top_tenants: list[TenantRevenue] = field(default_factory=list)

    @property
    def total(self) -> Decimal:
        return sum((month.total for month in self.by_month), ZERO)


def _currency_of(rows: list[RevenueRow], asked: str) -> tuple[str, dict[str, Decimal]]:
    """The currency to chart (the one asked for, else the one with most revenue, else
    the open invoices' or USD) and the others' totals."""
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        totals[row.currency] += row.amount
    if asked:
        currency = asked
    elif totals:
        currency = max(sorted(totals), key=lambda c: totals[c])
    else:
        currency = "USD"
    return currency, {c: amount for c, amount in sorted(totals.items()) if c != currency}


def top_tenants(
    *, scope: FinanceScope, start: datetime, end: datetime, currency: str, limit: int = TOP_TENANTS
) -> list[TenantRevenue]:
    """The tenants with most revenue in [start, end), from the same sources."""
    amounts: dict[int, Decimal] = defaultdict(Decimal)
    for row in revenue_rows(scope=scope, start=start, end=end, dimensions=["tenant_id"]):
        if row.currency == currency:
            amounts[row.tenant_id] += row.amount
    ranked = sorted(amounts, key=lambda pk: (-amounts[pk], pk))[:limit]
    tenants = Tenant.objects.in_bulk(ranked)
    return [
        TenantRevenue(name=tenants[pk].name, slug=tenants[pk].slug, amount=amounts[pk])
        for pk in ranked
        if pk in tenants and amounts[pk]
    ]


def revenue_dashboard(
    *, scope: FinanceScope, start: datetime, end: datetime, now: datetime, currency: str = ""
) -> RevenueDashboard:
    months = months_between(start, end)
    rows = revenue_rows(scope=scope, start=start, end=end, dimensions=["month", "gpu_type", "tier"])
    currency, others = _currency_of(rows, currency)
    rows = [row for row in rows if row.currency == currency and row.amount]
    invoiced = {month: ZERO for month in months}
    ledger = {month: ZERO for month in months}
    tier_totals: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        (invoiced if row.source == INVOICED else ledger)[row.month] += row.amount
        tier_totals[TIER_LABELS.get(row.tier, row.tier)] += row.amount
    gpu_labels = gpu_type_labels({row.gpu_type for row in rows if row.gpu_type})
    return RevenueDashboard(
        start=start,
        end=end,
        currency=currency,
        other_currencies=others,
        months=months,
        by_month=[MonthSource(m, invoiced[m], ledger[m]) for m in months],
        by_gpu_type=_series(rows, months, "gpu_type", gpu_labels),
        by_tier=_series(rows, months, "tier", TIER_LABELS),
        tier_totals=dict(sorted(tier_totals.items())),
        gpu_hours=gpu_hours_sold(scope=scope, start=start, end=end, months=months),
        utilisation=pool_utilisation(scope=scope, start=start, end=end, now=now),
        ageing=invoice_ageing(scope=scope, now=now, currency=currency),
        top_tenants=(
            top_tenants(scope=scope, start=start, end=end, currency=currency)
            if scope.staff and scope.tenant is None
            else []
        ),
    )
