"""What the launch form offers: the GPU type × region × tier combinations that launchable
pools have (`marketplace.selectors.launch_pools`, the pools a launch is placed on), the
GPUs per node those pools' nodes have, the images that run on the hardware, and the free
capacity and queue of the pools the choices land on.

`launch_choices` resolves what a user asked (a form, its htmx refresh, a prefill link)
into choices that exist, saying what it had to change. The form offers its lists and
accepts only what it resolves unchanged; `spec_validate` places the launch through the
same `launch_pools`, so the form can't offer what the launch then refuses."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from django.utils import timezone

from console.models import Tenant
from console.service_errors import ServiceError
from jobs.extensions import volume_provider
from jobs.fleet import PoolLoad, fleet_pools
from jobs.models import Job, Priority
from jobs.selectors import queued_ahead_of
from jobs.services.spec import validate_volume_mounts
from marketplace.models import GpuType, Image, NodePool, Region, Tier
from marketplace.pricing import NodeSplit, node_split
from marketplace.selectors import default_region, image_hardware, launch_pools, regions_for_tenant

# The tiers a launch places nodes on (reserved capacity is sold by commitment, not here).
LAUNCH_TIERS = (Tier.ON_DEMAND, Tier.SPOT)
MAX_NODES = 1024


@dataclass(frozen=True)
class PoolCapacity:
    """One pool the choices land on: its load as admission counts it, and what the launch
    would take of it."""

    tier: str
    load: PoolLoad
    nodes: int  # the launch's nodes on this pool
    asked: int  # GPUs (vCPUs for CPU) the launch would hold here

    @property
    def fits_now(self) -> bool:
        return self.load.free >= self.asked

    @property
    def tier_label(self) -> str:
        return Tier(self.tier).label


@dataclass
class LaunchChoices:
    """The launch form's dependent choices, resolved (see the module's docstring)."""

    gpu_types: list[GpuType]
    cpu_offered: bool
    gpu_type: GpuType | None
    regions: list[Region]
    region: Region | None
    tiers: list[str]  # offered for the GPU type in the region
    gpus_per_node_choices: list[int]
    gpus_per_node: int
    nodes: int
    spot_ratio: Decimal
    split: NodeSplit | None
    images: list[Image]  # run on the hardware; those made for it first
    image: Image | None
    # What was asked but doesn't exist, and what was chosen instead.
    notes: list[str] = field(default_factory=list)
    capacity: list[PoolCapacity] = field(default_factory=list)
    queued_ahead: int = 0
    # The spot ratio asked was changed (unreadable, or a tier that isn't offered).
    spot_ratio_changed: bool = False

    @property
    def hardware_label(self) -> str:
        return self.gpu_type.model if self.gpu_type else "CPU"

    @property
    def spot_only(self) -> bool:
        return self.tiers == [Tier.SPOT]

    @property
    def on_demand_only(self) -> bool:
        return Tier.SPOT not in self.tiers

    @property
    def fits_now(self) -> bool:
        return bool(self.capacity) and all(c.fits_now for c in self.capacity)


def _usable(pool: NodePool) -> bool:
    """A pool a launch can get anything from (a GPU pool whose nodes have GPUs)."""
    return pool.gpus_per_node >= 1 if pool.gpu_type_id else pool.allocatable_vcpus >= 1


def launch_images(*, tenant: Tenant | None) -> list[Image]:
    """The images a tenant may launch, in catalog order. A private image whose slug a
    public one has (made before such clashes were refused) is left out: the slug names
    the public image, here and in the spec."""
    active = Image.objects.for_tenant(tenant).filter(is_active=True)
    public_slugs = active.filter(tenant__isnull=True).values("slug")
    return list(active.exclude(tenant__isnull=False, slug__in=public_slugs))


def made_for(image: Image, gpu_type: GpuType | None) -> bool:
    """An image built for the hardware, not one that merely runs on it ("Python 3.11
    (CPU)" runs on an NVIDIA node but uses none of its GPUs): for a GPU, one with its
    vendor's runtime (CUDA, ROCm) or without CPU in its list; for CPU, one without a
    GPU runtime."""
    hardware = image_hardware(gpu_type)
    if hardware not in image.compatible_with:
        return False
    runtime = image.cuda_version or image.rocm_version
    if gpu_type is None:
        return not runtime
    return bool(runtime) or "cpu" not in image.compatible_with


def _int(value, default: int | None) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _ratio(value) -> Decimal | None:
    try:
        ratio = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        return None
    return ratio if ratio.is_finite() and Decimal(0) <= ratio <= Decimal(1) else None


def launch_choices(
    *,
    tenant: Tenant | None,
    gpu_type: str | None,
    region: str | None,
    gpus_per_node=None,
    nodes=None,
    spot_ratio=None,
    image: str | None = None,
    cpus=None,
    priority: str = Priority.NORMAL,
    switch_image: bool = False,
    with_capacity: bool = True,
) -> LaunchChoices:
    """Resolve the asked values (strings from a form or a link, or None) into choices that
    exist. `switch_image`: the hardware was just changed, so an image that only runs on
    it (not made for it) gives way to one made for it."""
    notes: list[str] = []
    pools = {key: pool for key, pool in launch_pools(tenant=tenant).items() if _usable(pool)}
    pools = {key: pool for key, pool in pools.items() if key[2] in LAUNCH_TIERS}
    gpu_ids = {key[0] for key in pools if key[0] is not None}
    gpu_types = list(GpuType.objects.filter(pk__in=gpu_ids, is_active=True))
    cpu_offered = any(key[0] is None for key in pools)

    # The GPU type ("" or None: CPU only).
    chosen_gpu = next((g for g in gpu_types if gpu_type and g.slug == gpu_type), None)
    if gpu_type and chosen_gpu is None:
        known = GpuType.objects.filter(slug=gpu_type).first()
        name = known.model if known else f"“{gpu_type}”"
        notes.append(f"{name} is not offered for launch here.")
    if chosen_gpu is None and not cpu_offered and gpu_types:
        chosen_gpu = gpu_types[0]
    gpu_id = chosen_gpu.pk if chosen_gpu else None

    # The region: one with a pool of that hardware.
    region_ids = {key[1] for key in pools if key[0] == gpu_id}
    regions = list(regions_for_tenant(tenant).filter(pk__in=region_ids))
    chosen_region = next((r for r in regions if region and r.slug == region), None)
    if chosen_region is None and regions:
        fallback = default_region(tenant, chosen_gpu)
        chosen_region = next((r for r in regions if fallback and r.pk == fallback.pk), regions[0])
        if region:
            asked = Region.objects.filter(slug=region).first()
            notes.append(
                f"{chosen_gpu.model if chosen_gpu else 'CPU'} is not offered in "
                f"{asked.name if asked else f'“{region}”'}: {chosen_region.name} chosen."
            )
    tiers = [t for t in LAUNCH_TIERS if chosen_region and (gpu_id, chosen_region.pk, t) in pools]

    # Nodes, and the spot ratio their split can honour with the tiers offered.
    node_count = _int(nodes, 1) or 1
    node_count = min(max(node_count, 1), MAX_NODES)
    ratio = asked_ratio = _ratio(spot_ratio)
    if ratio is None:
        if spot_ratio not in (None, ""):
            notes.append(f"“{spot_ratio}” is not a spot ratio (0 to 1).")
        ratio = Decimal(0)
    split = node_split(nodes=node_count, spot_ratio=ratio) if tiers else None
    if split is not None:
        needs = {Tier.SPOT} if split.spot_nodes else set()
        needs |= {Tier.ON_DEMAND} if split.on_demand_nodes else set()
        if not needs <= set(tiers):
            ratio = Decimal(1) if tiers == [Tier.SPOT] else Decimal(0)
            where = f"{chosen_gpu.model if chosen_gpu else 'CPU'} in {chosen_region.name}"
            only = "spot" if ratio else "on-demand"
            notes.append(f"{where} is {only} only: spot ratio set to {ratio}.")
            split = node_split(nodes=node_count, spot_ratio=ratio)
    landing: list[tuple[str, NodePool, int]] = []
    if split is not None and chosen_region is not None:
        for tier, tier_nodes in ((Tier.ON_DEMAND, split.on_demand_nodes),
                                 (Tier.SPOT, split.spot_nodes)):  # fmt: skip
            if tier_nodes:
                landing.append((tier, pools[(gpu_id, chosen_region.pk, tier)], tier_nodes))

    # GPUs per node: up to what the nodes of every pool it lands on have.
    if chosen_gpu is None:
        gpus_choices, gpus = [0], 0
    else:
        per_node = min((pool.gpus_per_node for _, pool, _ in landing), default=0)
        gpus_choices = list(range(1, per_node + 1))
        asked_gpus = _int(gpus_per_node, 0) or 0
        gpus = asked_gpus if asked_gpus in gpus_choices else (gpus_choices[-1] if per_node else 0)
        if asked_gpus and asked_gpus != gpus:
            notes.append(f"The nodes here have {per_node} GPUs: {gpus} per node chosen.")

    # The image: one that runs on the hardware, made for it where it was just changed.
    runnable = [
        i for i in launch_images(tenant=tenant) if image_hardware(chosen_gpu) in i.compatible_with
    ]
    images = sorted(runnable, key=lambda i: not made_for(i, chosen_gpu))
    chosen_image = next((i for i in images if image and i.slug == image), None)
    asked_image = chosen_image
    if chosen_image is not None and switch_image and not made_for(chosen_image, chosen_gpu):
        chosen_image = None
    if chosen_image is None and images:
        previous = Image.objects.filter(slug=image or "").first() if image else None
        framework = asked_image.framework if asked_image else (previous and previous.framework)
        chosen_image = next(
            (
                i
                for i in images
                if framework and i.framework == framework and made_for(i, chosen_gpu)
            ),
            images[0],
        )
        if image and asked_image is None:
            notes.append(
                f"{previous.name if previous else f'“{image}”'} doesn't run on "
                f"{chosen_gpu.model if chosen_gpu else 'CPU'}: {chosen_image.name} chosen."
            )

    choices = LaunchChoices(
        gpu_types=gpu_types,
        cpu_offered=cpu_offered,
        gpu_type=chosen_gpu,
        regions=regions,
        region=chosen_region,
        tiers=tiers,
        gpus_per_node_choices=gpus_choices,
        gpus_per_node=gpus,
        nodes=node_count,
        spot_ratio=ratio,
        split=split,
        images=images,
        image=chosen_image,
        notes=notes,
        spot_ratio_changed=asked_ratio != ratio,
    )
    if with_capacity and landing:
        _add_capacity(choices, landing, cpus=_int(cpus, 1) or 1, priority=priority)
    return choices


def _add_capacity(
    choices: LaunchChoices, landing: list[tuple[str, NodePool, int]], *, cpus: int, priority: str
) -> None:
    """Free capacity of the pools the launch lands on, as admission counts it (the staff
    fleet page's loads), and the queued jobs that admission would take before it."""
    loads = {load.pool.pk: load for load in fleet_pools(pool_ids=[p.pk for _, p, _ in landing])}
    per_node = choices.gpus_per_node if choices.gpu_type else cpus
    choices.capacity = [
        PoolCapacity(tier=tier, load=loads[pool.pk], nodes=n, asked=n * per_node)
        for tier, pool, n in landing
        if pool.pk in loads
    ]
    pool_ids = {tier: pool.pk for tier, pool, _ in landing}
    # The launch as admission would rank it: submitted now, at its priority.
    probe = Job(
        pk=0,
        priority=priority if priority in Priority.values else Priority.NORMAL,
        created_at=timezone.now(),
        pool_id=pool_ids.get(Tier.ON_DEMAND),
        spot_pool_id=pool_ids.get(Tier.SPOT),
    )
    choices.queued_ahead = queued_ahead_of(probe).count()


def mount_problem(*, tenant: Tenant | None, region: Region, mounts: list[dict]) -> str:
    """What would refuse these volume mounts for a job in `region` (a volume in another
    region, first of all), as the launch says it; "" when nothing would."""
    try:
        volume_provider().check_mounts(
            tenant=tenant, region=region, mounts=validate_volume_mounts(mounts)
        )
    except ServiceError as error:
        return error.message
    return ""
