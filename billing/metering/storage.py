"""Storage metering: each volume's provisioned GiB-hours into the same ledger as jobs'
usage, tier "storage", from its creation until it is deleted (attached or not).

A record covers one piece of a volume's life at one size (billing.metering.pieces: cut
at hours and price-book changes, priced after the tenant's discount), and a resize meters
the volume up to that instant at the old size first. Its unit price is the region's
storage price per GiB-hour:

    amount = size_gib × hours × price_per_gib_hour × (100 − discount %) / 100

A volume's cursor is the end of its last record; records go to the rollups and daily
totals as they are written (there is no pending hour, as jobs' meters have). The tick
runs this in its own turn (`billing.metering.tick`)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from billing.metering.pieces import PieceBook
from billing.metering.rollups import rollups_add_records
from billing.models import UsageRecord
from marketplace.models import StoragePrice
from storage.models import Volume

STORAGE_TIER = "storage"


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
    book = PieceBook(
        {(p.version_id, p.region_id): p.price_per_gib_hour for p in StoragePrice.objects.all()}
    )
    records: list[UsageRecord] = []
    for volume in volumes:
        records += book.records(
            tenant_id=volume.tenant_id,
            region=volume.region,
            start=volume.metered_until or volume.created_at,
            end=min(now, volume.deleted_at or now),
            units=volume.size_gib,
            ref=volume.pk,
            name=f"volume {volume.name}",
            tier=STORAGE_TIER,
            gap_note=f"no storage price for {volume.region.slug} in the price book",
        )
    if not records:
        return 0, set()
    UsageRecord.objects.bulk_create(records)
    rollups_add_records(records, gpu_type=STORAGE_TIER)
    return len(records), {r.tenant_id for r in records}
