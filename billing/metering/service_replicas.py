"""Services' metering: each replica's usage, from its start until it stops, into the
same ledger as jobs' usage, tier "service": a CPU replica's vCPU-seconds, a GPU
replica's GPU-seconds (its revision's `gpus_per_replica`, of its service's GPU type).

A record covers one piece of a replica's life (billing.metering.pieces: cut at hours
and price-book changes, priced after the tenant's discount, as jobs are). Its unit
price is the on-demand price of the service's region in the price book: per vCPU-hour
(the entry with no GPU type) for a CPU replica, per GPU-hour of the service's GPU type
for a GPU replica (GPU replicas run on an on-demand pool):

    CPU: amount = cpus × hours × price_per_vcpu_hour × (100 − discount %) / 100
    GPU: amount = gpus_per_replica × hours × price_per_gpu_hour × (100 − discount %) / 100

GPU records carry their GPU type and GPU-seconds, as jobs' do, so the rollups, the Cost
Explorer and the invoice group them by GPU type; CPU records go under "cpu".

A replica's cursor is the end of its last record (`job_ref` is the replica's id); its
time ends at `stopped_at`. Replica rows are deleted soon after they stop, so they are
metered up to their stop first (services.signals.replicas_removing, received in
billing.receivers). The tick runs this in its own turn (`billing.metering.tick`)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal

from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from billing.metering.pieces import PieceBook
from billing.metering.rollups import rollups_add_records
from billing.models import UsageRecord
from marketplace.models import GpuType, PriceEntry
from services.models import ReplicaState, ServiceReplica

SERVICE_TIER = "service"
CPU = "cpu"  # what the Cost Explorer groups CPU replicas' records by (GPU ones: the slug)


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
        .select_related("service", "service__region", "service__gpu_type", "revision")
    )
    if replica_ids is not None:
        replicas = replicas.filter(pk__in=replica_ids)
    return replicas


def _gpu_type(replica: ServiceReplica) -> GpuType | None:
    """What a replica's GPUs are (None: a CPU replica): its revision's, on its service's type."""
    return replica.service.gpu_type if replica.revision.gpus_per_replica > 0 else None


def _list_prices(gpu_type_ids: set[int]) -> dict[int | None, dict[tuple[int, int], Decimal]]:
    """On-demand list prices by GPU type id (None: per vCPU), then (version, region): one
    read for the CPU price and every GPU type the replicas use."""
    prices: dict[int | None, dict[tuple[int, int], Decimal]] = defaultdict(dict)
    entries = PriceEntry.objects.filter(Q(gpu_type=None) | Q(gpu_type__in=gpu_type_ids))
    for entry in entries:
        prices[entry.gpu_type_id][(entry.version_id, entry.region_id)] = entry.on_demand_price
    return prices


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
    prices = _list_prices({gpu.pk for r in replicas if (gpu := _gpu_type(r)) is not None})
    book = PieceBook(prices[None])
    by_rollup_key: dict[str, list[UsageRecord]] = defaultdict(list)
    for replica in replicas:
        service = replica.service
        gpu_type = _gpu_type(replica)
        common = {
            "tenant_id": service.tenant_id,
            "region": service.region,
            "start": replica.metered_until or replica.started_at,
            "end": min(now, replica.stopped_at or now),
            "ref": replica.pk,
            "name": f"service {service.name}",
            "tier": SERVICE_TIER,
        }
        if gpu_type is None:
            by_rollup_key[CPU] += book.records(
                **common,
                units=replica.revision.cpus,
                gap_note=f"no CPU price for {service.region.slug} in the price book",
                cpu_time=True,
            )
        else:
            by_rollup_key[gpu_type.slug] += book.records(
                **common,
                units=replica.revision.gpus_per_replica,
                gap_note=f"no {gpu_type.slug} price for {service.region.slug} in the price book",
                gpu_type=gpu_type,
                list_prices=prices[gpu_type.pk],
            )
    records = [record for group in by_rollup_key.values() for record in group]
    if not records:
        return 0, set()
    UsageRecord.objects.bulk_create(records)
    for rollup_key, group in by_rollup_key.items():
        if group:
            rollups_add_records(group, gpu_type=rollup_key)
    return len(records), {r.tenant_id for r in records}
