"""Storage metering: each volume's provisioned GiB-hours into the same ledger as jobs'
usage, tier "storage", from its creation until it is deleted (attached or not).

A record covers one piece of a volume's life at one size: pieces are cut at hour
boundaries (each rolls up into one hour) and where a price-book version takes effect, and
a resize meters the volume up to that instant at the old size first. A piece is priced
by the region's storage price of the version in force at its start, after the tenant's
negotiated discount (as compute is):

    amount = size_gib × hours × price_per_gib_hour × (100 − discount %) / 100
             (rounded once, to AMOUNT_QUANTUM)

A volume's cursor is the end of its last record; records go to the rollups and daily
totals as they are written (there is no pending hour, as jobs' meters have). The tick
runs this in its own turn (`billing.metering.tick`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from billing.metering.rollups import rollups_add_records
from billing.models import AMOUNT_QUANTUM, UsageRecord
from marketplace.models import PriceVersion, StoragePrice, TenantPricing
from marketplace.pricing import after_tenant_discount
from storage.models import Volume

STORAGE_TIER = "storage"
SECOND = Decimal(1)
HOUR_SECONDS = Decimal(3600)
UNIT_PRICE_QUANTUM = Decimal("0.000000001")  # UsageRecord.unit_price's decimal places


def storage_amount(*, size_gib: int, seconds: Decimal, price_per_gib_hour: Decimal) -> Decimal:
    """What `size_gib` provisioned for `seconds` costs: size × hours × price, rounded once."""
    return (Decimal(size_gib) * seconds * price_per_gib_hour / HOUR_SECONDS).quantize(
        AMOUNT_QUANTUM
    )


def exact_seconds(start: datetime, end: datetime) -> Decimal:
    delta = end - start  # exact, in Decimal (timedelta's total_seconds is a float)
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / 10**6


def _next_hour(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


def hour_pieces(start: datetime, end: datetime, cuts: list[datetime]):
    """[start, end) cut at hour boundaries and at `cuts` (sorted)."""
    while start < end:
        stop = min(end, _next_hour(start), *(c for c in cuts if c > start))
        yield start, stop
        start = stop


def volumes_to_meter(*, now: datetime, volume_ids: list[int] | None = None):
    """Volumes with time not yet metered before `now`, with their cursor (None: never)."""
    last_end = (
        UsageRecord.objects.filter(tier=STORAGE_TIER, job_ref=OuterRef("pk"))
        .order_by("-interval_end")
        .values("interval_end")[:1]
    )
    volumes = (
        Volume.objects.annotate(metered_until=Subquery(last_end))
        .filter(
            Q(deleted_at=None) | Q(metered_until=None) | Q(deleted_at__gt=F("metered_until")),
            created_at__lt=now,
        )
        .select_related("region")
    )
    if volume_ids is not None:
        volumes = volumes.filter(pk__in=volume_ids)
    return volumes


def storage_meter(
    *, now: datetime | None = None, volume_ids: list[int] | None = None
) -> tuple[int, set[int]]:
    """Write the storage records of every volume (or of `volume_ids`) up to `now` (or to
    its deletion); returns how many, and the tenants they bill. Runs in a transaction
    that takes the tick's turn."""
    now = now or timezone.now()
    volumes = list(volumes_to_meter(now=now, volume_ids=volume_ids))
    if not volumes:  # one query per tick where no volume exists
        return 0, set()
    versions = list(PriceVersion.objects.order_by("effective_from", "pk"))
    prices = {
        (price.version_id, price.region_id): price.price_per_gib_hour
        for price in StoragePrice.objects.all()
    }
    # The negotiated discount applies to storage as to compute, through the one rule
    # (marketplace.pricing.after_tenant_discount).
    discounts = dict(TenantPricing.objects.values_list("tenant_id", "discount_percent"))
    cuts = [version.effective_from for version in versions]
    records: list[UsageRecord] = []
    for volume in volumes:
        start = volume.metered_until or volume.created_at
        end = min(now, volume.deleted_at or now)
        for piece_start, piece_end in hour_pieces(start, end, cuts):
            version = next((v for v in reversed(versions) if v.effective_from <= piece_start), None)
            list_price = prices.get((version.pk, volume.region_id)) if version else None
            discount = discounts.get(volume.tenant_id, Decimal(0))
            price = after_tenant_discount(list_price, discount) if list_price is not None else None
            seconds = exact_seconds(piece_start, piece_end)
            amount = (
                storage_amount(size_gib=volume.size_gib, seconds=seconds, price_per_gib_hour=price)
                if price is not None
                else Decimal(0)
            )
            records.append(
                UsageRecord(
                    tenant_id=volume.tenant_id,
                    job=None,
                    job_ref=volume.pk,
                    job_name=f"volume {volume.name}",
                    attempt=1,
                    tier=STORAGE_TIER,
                    region=volume.region,
                    interval_start=piece_start,
                    interval_end=piece_end,
                    units=volume.size_gib,
                    price_version=version,
                    # Stored to the column's 9 places; the amount used the exact price.
                    unit_price=price.quantize(UNIT_PRICE_QUANTUM)
                    if price is not None
                    else Decimal(0),
                    discount_percent=discount,
                    amount=amount,
                    on_demand_amount=amount,
                    currency=version.currency if version else "USD",
                    note=""
                    if price is not None
                    else f"no storage price for {volume.region.slug} in the price book",
                )
            )
    if not records:
        return 0, set()
    UsageRecord.objects.bulk_create(records)
    rollups_add_records(records, gpu_type=STORAGE_TIER)
    return len(records), {r.tenant_id for r in records}
