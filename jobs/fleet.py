"""Reads for the staff fleet page: every active pool's load as admission counts it,
the organisations holding or waiting for compute, and the queue by what it waits for.
Across all tenants, for staff only (a module of its own: it reads admission's usage,
which itself reads `jobs.selectors`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from django.db.models import Count, F, Q, QuerySet, Sum

from jobs.models import HOLDING_COMPUTE, Job, JobStatus, WaitKind
from jobs.selectors import wanting_pools
from jobs.services.admission import held_usage
from marketplace.models import NodePool


@dataclass(frozen=True)
class PoolLoad:
    """One active pool as admission counts it: what its admitted jobs hold (not what the
    last capacity sync reported) and how many queued jobs want it."""

    pool: NodePool
    capacity: int
    held: int
    queued: int
    unit: str

    @property
    def free(self) -> int:
        return max(self.capacity - self.held, 0)

    @property
    def percent_used(self) -> int:
        return round(100 * self.held / self.capacity) if self.capacity else 0


def fleet_pools(*, pool_ids: Collection[int] | None = None) -> list[PoolLoad]:
    """Every active pool's load (or only those of `pool_ids`: the launch form's)."""
    active = NodePool.objects.filter(is_active=True)
    if pool_ids is not None:
        active = active.filter(pk__in=list(pool_ids))
    pools = list(
        active.select_related("region", "gpu_type").order_by(
            "region__slug", "gpu_type__slug", "tier", "name"
        )
    )
    usage = held_usage(pool_ids=[p.pk for p in pools], tenant_ids=[])
    queued = Job.objects.filter(status=JobStatus.QUEUED).order_by()
    if pool_ids is not None:
        queued = queued.filter(wanting_pools([p.pk for p in pools]))
    wanted: dict[int, int] = {}
    for pool_field in ("pool_id", "spot_pool_id"):
        for pool_id, count in (
            queued.filter(**{f"{pool_field}__isnull": False})
            .values_list(pool_field)
            .annotate(n=Count("pk"))
        ):
            wanted[pool_id] = wanted.get(pool_id, 0) + count
    loads = []
    for pool in pools:
        gpu = pool.gpu_type_id is not None
        loads.append(
            PoolLoad(
                pool=pool,
                capacity=pool.allocatable_gpus if gpu else pool.allocatable_vcpus,
                held=(usage.pool_gpus if gpu else usage.pool_vcpus)[pool.pk],
                queued=wanted.get(pool.pk, 0),
                unit="GPUs" if gpu else "vCPUs",
            )
        )
    return loads


def fleet_tenants() -> QuerySet:
    """Organisations with work holding compute or queued, the busiest first."""
    return (
        Job.objects.filter(status__in=[*HOLDING_COMPUTE, JobStatus.QUEUED])
        .order_by()
        .values("tenant__name", "tenant__slug")
        .annotate(
            running=Count("pk", filter=Q(status=JobStatus.RUNNING)),
            holding=Count("pk", filter=Q(status__in=HOLDING_COMPUTE)),
            queued=Count("pk", filter=Q(status=JobStatus.QUEUED)),
            gpus=Sum(
                F("nodes") * F("gpus_per_node"), filter=Q(status__in=HOLDING_COMPUTE), default=0
            ),
        )
        .order_by("-gpus", "-holding", "tenant__name")
    )


def fleet_queue() -> list[tuple[str, int]]:
    """Queued jobs by what they wait for (the wait kinds' labels), most first."""
    labels = dict(WaitKind.choices)
    rows = (
        Job.objects.filter(status=JobStatus.QUEUED)
        .order_by()
        .values_list("wait_kind")
        .annotate(n=Count("pk"))
    )
    return sorted(((labels.get(kind, kind), n) for kind, n in rows), key=lambda r: -r[1])


def jobs_on_pool(*, pool: NodePool) -> QuerySet[Job]:
    """The jobs holding compute on `pool` (what reclaiming it hits), with their tenant."""
    return (
        Job.objects.filter(status__in=HOLDING_COMPUTE)
        .filter(Q(pool=pool) | Q(spot_pool=pool))
        .select_related("tenant")
        .order_by("tenant__name", "pk")
    )
