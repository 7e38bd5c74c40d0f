"""Metering of what is billed by the unit-hour outside the jobs' tick: volumes' storage
(billing.metering.storage) and services' replicas (billing.metering.service_replicas).

A life [start, end) is cut at hour boundaries (each piece rolls up into one hour) and
where a price-book version takes effect; each piece is priced by the list price of the
version in force at its start, after the tenant's negotiated discount (the one rule,
marketplace.pricing.after_tenant_discount), and written as one ledger record:

    amount = units × hours × unit price × (100 − discount %) / 100   (rounded once)

A piece with no list price is recorded at zero with a note (a price-book gap)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.models import AMOUNT_QUANTUM, UsageRecord
from marketplace.models import GpuType, PriceVersion, Region, TenantPricing
from marketplace.pricing import after_tenant_discount

HOUR_SECONDS = Decimal(3600)
UNIT_PRICE_QUANTUM = Decimal("0.000000001")  # UsageRecord.unit_price's decimal places
SECONDS_QUANTUM = Decimal("0.001")  # UsageRecord.cpu_seconds' decimal places


def unit_hours_amount(*, units: int, seconds: Decimal, price_per_unit_hour: Decimal) -> Decimal:
    """What `units` (GiB, vCPUs) for `seconds` cost: units × hours × price, rounded once."""
    return (Decimal(units) * seconds * price_per_unit_hour / HOUR_SECONDS).quantize(AMOUNT_QUANTUM)


def exact_seconds(start: datetime, end: datetime) -> Decimal:
    delta = end - start  # exact, in Decimal (timedelta's total_seconds is a float)
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / 10**6


def _next_hour(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


def hour_pieces(start: datetime, end: datetime, cuts: list[datetime]) -> Iterator[tuple]:
    """[start, end) cut at hour boundaries and at `cuts` (sorted)."""
    while start < end:
        stop = min(end, _next_hour(start), *(c for c in cuts if c > start))
        yield start, stop
        start = stop


class PieceBook:
    """The price-book versions, one kind of list price by (version id, region id) and
    the tenants' discounts, read once per metering run (a caller with several kinds of
    price passes the other kinds' to `records`)."""

    def __init__(self, list_prices: dict[tuple[int, int], Decimal]):
        self.versions = list(PriceVersion.objects.order_by("effective_from", "pk"))
        self.cuts = [version.effective_from for version in self.versions]
        self.list_prices = list_prices
        self.discounts = dict(TenantPricing.objects.values_list("tenant_id", "discount_percent"))

    def records(
        self,
        *,
        tenant_id: int,
        region: Region,
        start: datetime,
        end: datetime,
        units: int,
        ref: int,
        name: str,
        tier: str,
        gap_note: str,
        cpu_time: bool = False,
        gpu_type: GpuType | None = None,
        list_prices: dict[tuple[int, int], Decimal] | None = None,
    ) -> list[UsageRecord]:
        """The records of [start, end) of `units` (`ref`/`name`: the ledger's job_ref and
        job_name); `cpu_time`: the units are vCPUs, their seconds go to cpu_seconds;
        `gpu_type`: the units are GPUs of that type, their seconds go to gpu_seconds (as
        jobs' records). `list_prices`: another kind of price than the book's."""
        records = []
        discount = self.discounts.get(tenant_id, Decimal(0))
        prices = self.list_prices if list_prices is None else list_prices
        for piece_start, piece_end in hour_pieces(start, end, self.cuts):
            version = next(
                (v for v in reversed(self.versions) if v.effective_from <= piece_start), None
            )
            list_price = prices.get((version.pk, region.pk)) if version else None
            price = after_tenant_discount(list_price, discount) if list_price is not None else None
            seconds = exact_seconds(piece_start, piece_end)
            amount = (
                unit_hours_amount(units=units, seconds=seconds, price_per_unit_hour=price)
                if price is not None
                else Decimal(0)
            )
            records.append(
                UsageRecord(
                    tenant_id=tenant_id,
                    job=None,
                    job_ref=ref,
                    job_name=name,
                    attempt=1,
                    tier=tier,
                    region=region,
                    interval_start=piece_start,
                    interval_end=piece_end,
                    units=units,
                    cpu_seconds=(units * seconds).quantize(SECONDS_QUANTUM)
                    if cpu_time
                    else Decimal(0),
                    gpu_type=gpu_type,
                    gpu_seconds=(units * seconds).quantize(SECONDS_QUANTUM)
                    if gpu_type is not None
                    else Decimal(0),
                    price_version=version,
                    # Stored to the column's 9 places; the amount used the exact price.
                    unit_price=price.quantize(UNIT_PRICE_QUANTUM)
                    if price is not None
                    else Decimal(0),
                    discount_percent=discount,
                    amount=amount,
                    on_demand_amount=amount,
                    currency=version.currency if version else "USD",
                    note="" if price is not None else gap_note,
                )
            )
        return records
