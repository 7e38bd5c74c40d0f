"""Where a launch runs: of the (region, GPU type) places its spec accepts, those whose
pools can take it are the candidates, and the cheapest weighted by data locality wins
(issue 31's `locality_weight`):

    score = the job's hourly price there ÷ the pool's locality_weight   in its data region
    score = the job's hourly price there                                 elsewhere

lowest first, ties to the most free GPUs (vCPUs for a CPU job), then the pool's name.
The data region is where the volumes it mounts are (a volume is usable only in its own
region, so with volumes no other region is a candidate), else the spec's `data_region`.

A spec naming one region and one GPU type is the one-candidate case: the same checks,
the same errors with the field at fault, and nothing to price. Pure reads."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal

from django.conf import settings

from console.models import Tenant
from console.service_errors import ErrorCode, ServiceError
from jobs.extensions import volume_provider
from jobs.services.admission import held_usage
from jobs.services.topology import largest_block_refusal
from marketplace.inventory import CPU_ARCHES, INTERCONNECTS
from marketplace.models import GpuType, Image, NodePool, Region, TenantQuota, Tier
from marketplace.pricing import NodeSplit, PricingError, estimate_cost
from marketplace.selectors import (
    default_region,
    image_hardware,
    launch_pools,
    launchable_pools,
    regions_for_tenant,
)

ONE = Decimal(1)
# What a job may require of its nodes: what capacity sync reads from node labels
# (NodePool.requirement_refusal matches them).
REQUIREMENT_VALUES = {"interconnect": INTERCONNECTS, "cpu_arch": CPU_ARCHES}


@dataclass(frozen=True)
class JobShape:
    """What placement needs of a spec whose own values are already valid."""

    nodes: int
    gpus_per_node: int
    cpus: int | None  # per node; None: the pool's vCPUs per node for a GPU job, else 1
    split: NodeSplit
    gpu_memory_gib: int | None
    mounts: list[dict]
    requirements: dict[str, str]
    # The spec's field for where, for what: "regions"/"gpu_types" when it named lists.
    region_field: str = "region"
    gpu_type_field: str = "gpu_type"


@dataclass(frozen=True)
class Candidate:
    """One acceptable place that can take the job, and what it costs there."""

    region: Region
    gpu_type: GpuType | None
    pool: NodePool | None  # its on-demand nodes' pool
    spot_pool: NodePool | None  # its spot nodes' pool
    cpus: int
    # Filled when there is a choice to make (`_ranked`):
    hourly: Decimal | None = None  # the job's price per hour here, the tenant's discount in
    currency: str = ""
    locality_weight: Decimal = ONE  # what the price is divided by: >1 in the data region
    free: int = 0  # GPUs (vCPUs) free now in its pools, as admission counts them

    @property
    def main_pool(self) -> NodePool:
        pool = self.pool or self.spot_pool
        assert pool is not None  # a job has on-demand or spot nodes, each with a pool
        return pool

    @property
    def pools(self) -> list[NodePool]:
        return [p for p in (self.pool, self.spot_pool) if p is not None]

    @property
    def label(self) -> str:
        return place_label(self.region, self.gpu_type)

    @property
    def score(self) -> Decimal | None:
        return None if self.hourly is None else self.hourly / self.locality_weight

    def describe(self) -> str:
        if self.hourly is None:
            return f"{self.label}: no price"
        price = f"{self.hourly} {self.currency}/h"
        if self.locality_weight == ONE:
            return f"{self.label}: {price}"
        return f"{self.label}: {price} ÷ locality {self.locality_weight} = {self.score:.2f}"


@dataclass(frozen=True)
class PlacementChoice:
    """Where the job runs, and how that was decided (for its timeline)."""

    chosen: Candidate
    ranked: list[Candidate]  # every candidate, best first
    refused: list[tuple[str, ServiceError]]  # acceptable places that can't take it, and why
    data_region: Region | None

    @property
    def was_a_choice(self) -> bool:
        return len(self.ranked) + len(self.refused) > 1

    def timeline_note(self) -> str:
        """The decision for the job's timeline: each candidate with its price and
        locality factor, the places refused and why, and the result."""
        where = f"data in {self.data_region.slug}" if self.data_region else "no data region"
        parts = [c.describe() for c in self.ranked]
        parts += [
            f"{label}: refused ({error.message.rstrip('.')})" for label, error in self.refused
        ]
        return (
            f"Placement ({where}; lowest price ÷ locality weight wins): {'; '.join(parts)}. "
            f"Chosen: {self.chosen.label}."
        )


def place_label(region: Region, gpu_type: GpuType | None) -> str:
    return f"{gpu_type.slug if gpu_type else 'CPU'} in {region.slug}"


def _invalid(message: str, field_name: str) -> ServiceError:
    return ServiceError(message, field=field_name)


def validate_requirements(requirements) -> dict[str, str]:
    """What the job's nodes must have: {"interconnect": nvlink|rdma|infiniband, "cpu_arch":
    amd64|arm64}, each optional (empty: not required). Matched against pools by
    NodePool.requirement_refusal."""
    if not isinstance(requirements, dict):
        raise _invalid('Requirements are an object, e.g. {"interconnect": "nvlink"}.',
                      "requirements")  # fmt: skip
    unknown = set(requirements) - set(REQUIREMENT_VALUES)
    if unknown:
        raise _invalid(
            f"Unknown requirement {', '.join(sorted(map(str, unknown)))}: the job may require "
            f"{' and '.join(REQUIREMENT_VALUES)}.",
            "requirements",
        )
    clean = {}
    for name, allowed in REQUIREMENT_VALUES.items():
        value = requirements.get(name) or ""
        if value and value not in allowed:
            raise _invalid(
                f"{name} “{str(value)[:40]}”: one of {', '.join(allowed)}.", "requirements"
            )
        if value:
            clean[name] = value
    return clean


def placement_choose(
    *,
    tenant: Tenant,
    shape: JobShape,
    gpu_types: list[GpuType | None],
    regions: list[Region],
    image: Image,
    data_region: Region | None,
    quotas: list[TenantQuota],
) -> PlacementChoice:
    """The place the job runs, of every (region, GPU type) it accepts; `regions` empty:
    each GPU type's default region (`default_region`). Raises the place's own
    ServiceError when only one was acceptable, else one naming why each was refused."""
    places: list[tuple[Region, GpuType | None]] = []
    refused: list[tuple[str, ServiceError]] = []
    for gpu_type in gpu_types:
        acceptable = regions or _default_regions(tenant, gpu_type)
        places += [(region, gpu_type) for region in acceptable]
        if not acceptable:
            what = f"an {gpu_type.model} pool" if gpu_type else "a CPU pool"
            error = _invalid(f"Choose a region: none has {what} for you.", shape.region_field)
            refused.append((gpu_type.slug if gpu_type else "CPU", error))

    volumes_region = _volumes_region(
        tenant=tenant, regions=list(dict.fromkeys(r for r, _ in places)), mounts=shape.mounts
    )
    if volumes_region is not None:
        if data_region is not None and data_region != volumes_region:
            raise _invalid(
                f"Its data is where its volumes are, {volumes_region.slug}, not "
                f"{data_region.slug}: leave data_region out, or give {volumes_region.slug}.",
                "data_region",
            )
        data_region = volumes_region
        away = _invalid(
            f"Its volumes are in {volumes_region.slug}; a volume is usable only in its region.",
            "volumes",
        )
        refused += [(place_label(r, g), away) for r, g in places if r != volumes_region]
        places = [(r, g) for r, g in places if r == volumes_region]

    pools = launch_pools(tenant=tenant, requirements=shape.requirements)
    candidates: list[Candidate] = []
    for region, gpu_type in places:
        try:
            candidate = _candidate(
                tenant=tenant, region=region, gpu_type=gpu_type, shape=shape, image=image,
                pools=pools, quotas=quotas,
            )  # fmt: skip
        except ServiceError as error:
            refused.append((place_label(region, gpu_type), error))
        else:
            candidates.append(candidate)
    if not candidates:
        raise _none_can(refused, shape)
    if len(candidates) > 1:
        candidates = _ranked(tenant=tenant, candidates=candidates, shape=shape,
                             data_region=data_region)  # fmt: skip
    return PlacementChoice(
        chosen=candidates[0], ranked=candidates, refused=refused, data_region=data_region
    )


def _default_regions(tenant: Tenant, gpu_type: GpuType | None) -> list[Region]:
    region = default_region(tenant, gpu_type)
    return [region] if region is not None else []


def _none_can(refused: list[tuple[str, ServiceError]], shape: JobShape) -> ServiceError:
    """No acceptable place can take the job: one place's own refusal, as it was; several
    each named with theirs, on their common field (else on the list that named them)."""
    if len(refused) == 1:
        return refused[0][1]
    fields = {error.field for _, error in refused}
    codes = {error.code for _, error in refused}
    list_field = shape.region_field if shape.region_field == "regions" else shape.gpu_type_field
    return ServiceError(
        "No acceptable region and GPU type can take this job. "
        + " ".join(f"{label}: {error.message}" for label, error in refused),
        code=codes.pop() if len(codes) == 1 else ErrorCode.INVALID,
        field=fields.pop() if len(fields) == 1 else list_field,
    )


def _volumes_region(*, tenant: Tenant, regions: list[Region], mounts: list[dict]) -> Region | None:
    """Of the acceptable `regions`, the one the job's volumes are in (None without
    volumes). The volume provider says where a mount is usable; when none of them is
    that place, say where the volumes are instead if that is another region."""
    if not mounts or not regions:
        return None
    errors: list[ServiceError] = []
    for region in regions:
        try:
            volume_provider().check_mounts(tenant=tenant, region=region, mounts=mounts)
        except ServiceError as error:
            errors.append(error)
        else:
            return region
    if len(regions) > 1:
        for region in regions_for_tenant(tenant).exclude(pk__in=[r.pk for r in regions]):
            try:
                volume_provider().check_mounts(tenant=tenant, region=region, mounts=mounts)
            except ServiceError:
                continue
            raise _invalid(
                f"Its volumes are in {region.slug}, which is not among the acceptable regions "
                f"({', '.join(r.slug for r in regions)}): a volume can only be mounted in its "
                "own region.",
                "volumes",
            )
    # A conflict (a volume held or being filled) says more than "it is elsewhere".
    raise next((e for e in errors if e.code != ErrorCode.INVALID), errors[0])


def _candidate(
    *,
    tenant: Tenant,
    region: Region,
    gpu_type: GpuType | None,
    shape: JobShape,
    image: Image,
    pools: dict,
    quotas: list[TenantQuota],
) -> Candidate:
    """The place as a candidate, or the ServiceError (with the field at fault) saying why
    it can't take the job: the image's hardware, its pools for the spot ratio's split and
    the requirements, their sizes and GPU memory, the organisation's quota maxima."""
    hardware = image_hardware(gpu_type)
    if hardware not in image.compatible_with:
        raise _invalid(
            f"{image.name} doesn't run on {hardware.upper()}; pick an image made for it.", "image"
        )
    split = shape.split
    gpu_type_id = gpu_type.pk if gpu_type else None
    pool = pools.get((gpu_type_id, region.pk, Tier.ON_DEMAND)) if split.on_demand_nodes else None
    spot_pool = pools.get((gpu_type_id, region.pk, Tier.SPOT)) if split.spot_nodes else None
    what = gpu_type.slug if gpu_type else "CPU"
    for tier, tier_nodes, found in ((Tier.ON_DEMAND, split.on_demand_nodes, pool),
                                    (Tier.SPOT, split.spot_nodes, spot_pool)):  # fmt: skip
        if tier_nodes and found is None:
            _refuse_lacking(tenant=tenant, region=region, gpu_type=gpu_type, tier=tier,
                            requirements=shape.requirements)  # fmt: skip
    if split.on_demand_nodes and pool is None:
        raise _invalid(
            f"No on-demand {what} pool in {region.slug} on this installation's "
            f"backends ({', '.join(settings.COMPUTE_BACKENDS)}).",
            shape.region_field,
        )
    if split.spot_nodes and spot_pool is None:
        raise _invalid(f"No spot {what} pool in {region.slug}; lower the spot ratio.", "spot_ratio")
    if pool and spot_pool and pool.backend != spot_pool.backend:
        raise _invalid("Spot and on-demand nodes of one job must be on one backend.", "spot_ratio")
    chosen = pool or spot_pool
    assert chosen is not None  # a job has on-demand or spot nodes, and each found a pool
    cpus = shape.cpus or (chosen.vcpus_per_node if gpu_type and chosen.vcpus_per_node else 1)
    if cpus < 1:
        raise _invalid("Ask for at least one vCPU per node.", "cpus")
    # Larger than the pool could ever hold: refuse now rather than queue forever.
    for tier_pool, tier_nodes in ((pool, split.on_demand_nodes), (spot_pool, split.spot_nodes)):
        if tier_pool:
            _check_size(tier_pool, tier_nodes, shape=shape, gpu_type=gpu_type, cpus=cpus)
    if not (pool and spot_pool) and (refusal := largest_block_refusal(chosen, shape.nodes)):
        raise _invalid(refusal, "nodes")  # a gang over TOPOLOGY_BLOCK_NODES: one block
    total_gpus = shape.nodes * shape.gpus_per_node
    for quota in quotas:
        if quota.max_gpus is None or not gpu_type:
            continue
        if (quota.gpu_type_id in (None, gpu_type.pk)) and total_gpus > quota.max_gpus:
            scope = gpu_type.slug if quota.gpu_type_id else "all GPU types"  # its own type
            raise _invalid(
                f"Your organisation's quota allows at most {quota.max_gpus} GPUs "
                f"({scope}); this job asks for {total_gpus}.",
                "nodes",
            )
    return Candidate(region=region, gpu_type=gpu_type, pool=pool, spot_pool=spot_pool, cpus=cpus)


def _refuse_lacking(
    *, tenant: Tenant, region: Region, gpu_type: GpuType | None, tier: str, requirements: dict
) -> None:
    """No pool of the kind has what the job requires while some lack only that: say what
    each lacks (NodePool.requirement_refusal), on `requirements`."""
    if not requirements:
        return
    lacking = launchable_pools(tenant).filter(region=region, gpu_type=gpu_type, tier=tier)
    reasons = [pool.requirement_refusal(requirements) for pool in lacking.order_by("name")]
    if reasons:
        what = gpu_type.slug if gpu_type else "CPU"
        raise _invalid(
            f"No {Tier(tier).label.lower()} {what} pool in {region.slug} has what this job "
            f"requires: {' '.join(reasons)}",
            "requirements",
        )


def _check_size(
    pool: NodePool, nodes: int, *, shape: JobShape, gpu_type: GpuType | None, cpus: int
) -> None:
    refusal = pool.gpu_memory_refusal(shape.gpu_memory_gib)
    if refusal:
        raise _invalid(f"{refusal} Pick a GPU type with more memory.", "gpu_memory_gib")
    if gpu_type and shape.gpus_per_node > max(pool.gpus_per_node, 0):
        raise _invalid(
            f"{pool.name} has {pool.gpus_per_node} GPUs per node; {shape.gpus_per_node} asked.",
            "gpus_per_node",
        )
    if gpu_type and nodes * shape.gpus_per_node > pool.total_gpus:
        raise _invalid(
            f"{pool.name} has {pool.total_gpus} GPUs in all; {nodes * shape.gpus_per_node} asked.",
            "nodes",
        )
    if not gpu_type and nodes * cpus > pool.allocatable_vcpus:
        raise _invalid(
            f"{pool.name} has {pool.allocatable_vcpus} vCPUs in all; {nodes * cpus} asked.",
            "cpus",
        )


def _ranked(
    *, tenant: Tenant, candidates: list[Candidate], shape: JobShape, data_region: Region | None
) -> list[Candidate]:
    """The candidates priced (the estimate's rule, the tenant's discount in) and ordered
    by score, then most free, then pool name. An unpriced place ranks after priced ones:
    nothing says it is cheaper."""
    usage = held_usage(pool_ids=[p.pk for c in candidates for p in c.pools], tenant_ids=[])
    priced = []
    for candidate in candidates:
        try:
            estimate = estimate_cost(
                gpu_type=candidate.gpu_type,
                region=candidate.region,
                nodes=shape.nodes,
                gpus_per_node=shape.gpus_per_node,
                cpus=candidate.cpus,
                spot_ratio=shape.split.spot_ratio,
                tenant=tenant,
            )
            hourly, currency = estimate.hourly, estimate.currency
        except PricingError:
            hourly, currency = None, ""
        local = data_region is not None and candidate.region.pk == data_region.pk
        free = sum(
            max(p.allocatable_gpus - usage.pool_gpus[p.pk], 0)
            if p.gpu_type_id
            else max(p.allocatable_vcpus - usage.pool_vcpus[p.pk], 0)
            for p in candidate.pools
        )
        priced.append(
            replace(
                candidate,
                hourly=hourly,
                currency=currency,
                locality_weight=candidate.main_pool.locality_weight if local else ONE,
                free=free,
            )
        )
    return sorted(
        priced,
        key=lambda c: (c.score is None, c.score or Decimal(0), -c.free, c.main_pool.name),
    )
