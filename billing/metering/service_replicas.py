"""Services' metering: each replica's vCPU-seconds, from its start until it stops, into
the same ledger as jobs' usage, tier "service".

A record covers one piece of a replica's life: pieces are cut at hour boundaries (each
rolls up into one hour) and where a price-book version takes effect. A piece is priced
at the CPU price (per vCPU-hour, on demand) of the service's region in the version in
force at its start, after the tenant's negotiated discount (as jobs are):

    amount = cpus × hours × price_per_vcpu_hour × (100 − discount %) / 100
             (rounded once, to AMOUNT_QUANTUM)

A replica's cursor is the end of its last record (`job_ref` is the replica's id); its
time ends at `stopped_at`. Replica rows are deleted soon after they stop, so they are
metered up to their stop first (services.signals.replicas_removing, received in
billing.receivers). The tick runs this in its own turn (`billing.metering.tick`)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from billing.metering.rollups import rollups_add_records
from billing.metering.storage import UNIT_PRICE_QUANTUM, exact_seconds, hour_pieces
from billing.models import AMOUNT_QUANTUM, UsageRecord
from marketplace.models import PriceEntry, PriceVersion, TenantPricing
from marketplace.pricing import after_tenant_discount
from services.models import ReplicaState, ServiceReplica

SERVICE_TIER = "service"
CPU = "cpu"  # what the Cost Explorer groups the records by (no GPU replicas yet)
HOUR_SECONDS = Decimal(3600)
SECONDS_QUANTUM = Decimal("0.001")  # UsageRecord.cpu_seconds' decimal places


def replica_amount(*, cpus: int, seconds: Decimal, price_per_vcpu_hour: Decimal) -> Decimal:
    """What `cpus` vCPUs for `seconds` cost: vCPUs × hours × price, rounded once."""
    return (Decimal(cpus) * seconds * price_per_vcpu_hour / HOUR_SECONDS).quantize(AMOUNT_QUANTUM)


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
    versions = list(PriceVersion.objects.order_by("effective_from", "pk"))
    prices = {
        (entry.version_id, entry.region_id): entry.on_demand_price
        for entry in PriceEntry.objects.filter(gpu_type=None)
    }
    discounts = dict(TenantPricing.objects.values_list("tenant_id", "discount_percent"))
    cuts = [version.effective_from for version in versions]
    records: list[UsageRecord] = []
    for replica in replicas:
        service = replica.service
        cpus = replica.revision.cpus
        start = replica.metered_until or replica.started_at
        end = min(now, replica.stopped_at or now)
        for piece_start, piece_end in hour_pieces(start, end, cuts):
            version = next((v for v in reversed(versions) if v.effective_from <= piece_start), None)
            list_price = prices.get((version.pk, service.region_id)) if version else None
            discount = discounts.get(service.tenant_id, Decimal(0))
            price = after_tenant_discount(list_price, discount) if list_price is not None else None
            seconds = exact_seconds(piece_start, piece_end)
            amount = (
                replica_amount(cpus=cpus, seconds=seconds, price_per_vcpu_hour=price)
                if price is not None
                else Decimal(0)
            )
            records.append(
                UsageRecord(
                    tenant_id=service.tenant_id,
                    job=None,
                    job_ref=replica.pk,
                    job_name=f"service {service.name}",
                    attempt=1,
                    tier=SERVICE_TIER,
                    region=service.region,
                    interval_start=piece_start,
                    interval_end=piece_end,
                    units=cpus,
                    cpu_seconds=(cpus * seconds).quantize(SECONDS_QUANTUM),
                    price_version=version,
                    unit_price=price.quantize(UNIT_PRICE_QUANTUM)
                    if price is not None
                    else Decimal(0),
                    discount_percent=discount,
                    amount=amount,
                    on_demand_amount=amount,
                    currency=version.currency if version else "USD",
                    note=""
                    if price is not None
                    else f"no CPU price for {service.region.slug} in the price book",
                )
            )
    if not records:
        return 0, set()
    UsageRecord.objects.bulk_create(records)
    rollups_add_records(records, gpu_type=CPU)
    return len(records), {r.tenant_id for r in records}
