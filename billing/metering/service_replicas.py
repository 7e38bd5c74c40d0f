"""Services' metering: each replica's vCPU-seconds, from its start until it stops, into
the same ledger as jobs' usage, tier "service".

A record covers one piece of a replica's life (billing.metering.pieces: cut at hours
and price-book changes, priced after the tenant's discount, as jobs are). Its unit
price is the CPU price (per vCPU-hour, on demand) of the service's region:

    amount = cpus × hours × price_per_vcpu_hour × (100 − discount %) / 100

A replica's cursor is the end of its last record (`job_ref` is the replica's id); its
time ends at `stopped_at`. Replica rows are deleted soon after they stop, so they are
metered up to their stop first (services.signals.replicas_removing, received in
billing.receivers). The tick runs this in its own turn (`billing.metering.tick`)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from billing.metering.pieces import PieceBook
from billing.metering.rollups import rollups_add_records
from billing.models import UsageRecord
from marketplace.models import PriceEntry
from services.models import ReplicaState, ServiceReplica

SERVICE_TIER = "service"
CPU = "cpu"  # what the Cost Explorer groups the records by (no GPU replicas yet)


def replicas_to_meter(*, now: datetime, replica_ids: list[int] | None = None):
    """Replicas with time not yet metered before `now`, with their cursor (None: never)."""
    last_end = (
        UsageRecord.objects.filter(tier=SERVICE_TIER, job_ref=OuterRef("pk"))
        .order_by("-interval_end")
        .values("interval_end")[:1]
    )
    replicas = (
        ServiceReplica.objects.annotate(metered_until=Subquery(last_end))
        .filter(
            # Running (not stopped), or stopped later than it was metered up to.
            (Q(stopped_at=None) & ~Q(state=ReplicaState.STOPPED))
            | Q(stopped_at__gt=F("started_at"), metered_until=None)
            | Q(stopped_at__gt=F("metered_until")),
            started_at__lt=now,
        )
        .select_related("service", "service__region", "revision")
    )
    if replica_ids is not None:
        replicas = replicas.filter(pk__in=replica_ids)
    return replicas


def replicas_meter(
    *, now: datetime | None = None, replica_ids: list[int] | None = None
) -> tuple[int, set[int]]:
    """Write the records of every replica (or of `replica_ids`) up to `now` (or to its
    stop); how many, and the tenants they bill. Runs in a transaction that takes the
    tick's turn."""
    now = now or timezone.now()
    replicas = list(replicas_to_meter(now=now, replica_ids=replica_ids))
    if not replicas:  # one query per tick where no replica runs
        return 0, set()
    book = PieceBook(
        {
            (entry.version_id, entry.region_id): entry.on_demand_price
            for entry in PriceEntry.objects.filter(gpu_type=None)
        }
    )
    records: list[UsageRecord] = []
    for replica in replicas:
        service = replica.service
        records += book.records(
            tenant_id=service.tenant_id,
            region=service.region,
            start=replica.metered_until or replica.started_at,
            end=min(now, replica.stopped_at or now),
            units=replica.revision.cpus,
            ref=replica.pk,
            name=f"service {service.name}",
            tier=SERVICE_TIER,
            gap_note=f"no CPU price for {service.region.slug} in the price book",
            cpu_time=True,
        )
    if not records:
        return 0, set()
    UsageRecord.objects.bulk_create(records)
    rollups_add_records(records, gpu_type=CPU)
    return len(records), {r.tenant_id for r in records}
