"""Reads for the marketplace: offers, catalog, images."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest

from console.charts import CPU_COLOUR, palette_colour
from console.crypto import decrypt_json
from console.models import Tenant
from marketplace.images import InvalidReference, parse_reference
from marketplace.models import (
    GpuType,
    Image,
    ImageInteractive,
    NewTenantPolicy,
    NodePool,
    PriceVersion,
    Region,
    RegistryCredential,
    TenantQuota,
    Tier,
    free_capacity,
)
from marketplace.price_book_cache import price_book
from marketplace.pricing import after_tenant_discount, tenant_discount_percent

THOUSAND = Decimal(1000)
MICRO = Decimal("0.000001")
POOL_CAPACITY_FIELDS = (
    "region_id", "gpu_type_id", "tier", "on_console_host", "allocatable_gpus", "in_use_gpus",
    "total_gpus", "allocatable_vcpus", "in_use_vcpus", "vcpus_per_node",
    "memory_gib_per_node", "simulated", "node_count", "gpus_per_node", "runtime_class_name",
    "interconnects", "cpu_arch",
)  # fmt: skip
SORTS = {
    "price": lambda o: (o.unit_price, o.gpu_label),
    "price_per_tflop": lambda o: (o.price_per_pflop_hour or Decimal("Infinity"), o.unit_price),
    "availability": lambda o: (-o.available, o.unit_price),
}


@dataclass(frozen=True)
class Offer:
    """One sellable row: GPU type (or CPU) × region × tier."""

    gpu_type: GpuType | None
    region: Region
    tier: str
    unit_price: Decimal  # per GPU-hour, or per vCPU-hour for CPU offers
    currency: str
    available: int  # GPUs, or vCPUs for CPU offers
    total: int
    vcpus_per_node: int
    memory_gib_per_node: int
    price_version: int
    # Its capacity is the sandbox cluster's simulated nodes (nothing runs on real GPUs).
    simulated: bool = False
    # Every pool that serves it runs pods in an isolated runtime (a RuntimeClass).
    isolated_runtime: bool = False
    # What every pool serving it has (from node labels): interconnects, one CPU
    # architecture ("" when mixed or unknown).
    interconnects: tuple[str, ...] = ()
    cpu_arch: str = ""
    # A price change already published for later: the price from `next_price_from` on
    # (None when the next price version keeps this offer's price or doesn't sell it).
    next_unit_price: Decimal | None = None
    next_price_from: datetime | None = None
    # GPUs per node of the pool a launch of this offer would use now: the one with the
    # most free GPUs (0 where no pool serves it, and for CPU offers).
    gpus_per_node: int = 0

    @property
    def is_cpu(self) -> bool:
        return self.gpu_type is None

    @property
    def gpu_label(self) -> str:
        return self.gpu_type.slug if self.gpu_type else "cpu"

    @property
    def memory_gib(self) -> int | None:
        return self.gpu_type.memory_gib if self.gpu_type else None

    @property
    def tflops(self) -> Decimal | None:
        return self.gpu_type.peak_tflops if self.gpu_type else None

    @property
    def price_per_pflop_hour(self) -> Decimal | None:
        if not self.gpu_type or not self.gpu_type.peak_tflops:
            return None
        return (self.unit_price * THOUSAND / self.gpu_type.peak_tflops).quantize(Decimal("0.0001"))

    @property
    def tier_label(self) -> str:
        return Tier(self.tier).label


def offers(
    *,
    tenant=None,
    vendor: str | None = None,
    gpu_type: str | None = None,
    min_memory_gib: int | None = None,
    region: str | None = None,
    tier: str | None = None,
    available_only: bool = False,
    include_cpu: bool = True,
    sort: str = "price",
    at: datetime | None = None,
    interconnect: str | None = None,
    cpu_arch: str | None = None,
) -> list[Offer]:
    book = price_book(at)
    if book is None:
        return []
    version, upcoming = book.version, book.upcoming
    discount = tenant_discount_percent(tenant)
    empty = {
        "available": 0, "total": 0, "vcpus": 0, "memory": 0, "simulated": 0,
        "node_gpus": 0, "node_free": -1, "pools": 0, "isolated": 0,
    }  # fmt: skip
    capacity: dict[tuple, dict[str, int]] = defaultdict(lambda: dict(empty))
    # Per offer: the interconnects all its pools have, and their CPU architectures.
    links: dict[tuple, set[str]] = {}
    arches: dict[tuple, set[str]] = defaultdict(set)
    allowed_on_host = may_run_on_host(tenant)
    # Every active pool in one read: the capacity of those the tenant may use.
    pools = NodePool.objects.filter(is_active=True).order_by().values(*POOL_CAPACITY_FIELDS)
    for pool in pools:
        if pool["on_console_host"] and not allowed_on_host:
            continue
        key = (pool["gpu_type_id"], pool["region_id"], pool["tier"])
        bucket = capacity[key]
        links[key] = links.get(key, set(pool["interconnects"])) & set(pool["interconnects"])
        arches[key].add(pool["cpu_arch"])
        if pool["gpu_type_id"]:
            free = free_capacity(pool["allocatable_gpus"], pool["in_use_gpus"])
            bucket["available"] += free
            bucket["total"] += pool["total_gpus"]
            if (free, pool["gpus_per_node"]) > (bucket["node_free"], bucket["node_gpus"]):
                bucket["node_free"], bucket["node_gpus"] = free, pool["gpus_per_node"]
        else:
            bucket["available"] += free_capacity(pool["allocatable_vcpus"], pool["in_use_vcpus"])
            bucket["total"] += pool["allocatable_vcpus"]
        bucket["vcpus"] = max(bucket["vcpus"], pool["vcpus_per_node"])
        bucket["memory"] = max(bucket["memory"], pool["memory_gib_per_node"])
        bucket["simulated"] |= pool["simulated"] and pool["node_count"] > 0
        bucket["pools"] += 1
        bucket["isolated"] += bool(pool["runtime_class_name"])
    hidden_regions = set(host_only_region_ids(tenant))  # (no query for allowed tenants)

    rows = []
    for priced in book.entries:
        entry = priced.entry
        if entry.region_id in hidden_regions:
            continue
        for tier_value in Tier.values:
            key = (entry.gpu_type_id, entry.region_id, tier_value)
            bucket = capacity.get(key, empty)
            arch = arches.get(key, set())
            price = after_tenant_discount(priced.prices.for_tier(tier_value), discount)
            unit_price, next_price = price.quantize(MICRO), None
            if priced.next_prices:
                price = after_tenant_discount(priced.next_prices.for_tier(tier_value), discount)
                next_price = price.quantize(MICRO)
            changed = priced.next_prices is not None and next_price != unit_price
            rows.append(
                Offer(
                    gpu_type=entry.gpu_type,
                    region=entry.region,
                    tier=tier_value,
                    unit_price=unit_price,
                    currency=version.currency,
                    available=bucket["available"],
                    total=bucket["total"],
                    vcpus_per_node=bucket["vcpus"],
                    memory_gib_per_node=bucket["memory"],
                    price_version=version.pk,
                    simulated=bool(bucket["simulated"]),
                    isolated_runtime=0 < bucket["pools"] == bucket["isolated"],
                    interconnects=tuple(sorted(links.get(key, ()))),
                    cpu_arch=next(iter(arch)) if len(arch) == 1 else "",
                    next_unit_price=next_price if changed else None,
                    next_price_from=upcoming.effective_from if changed and upcoming else None,
                    gpus_per_node=bucket["node_gpus"],
                )
            )

    def keep(offer: Offer) -> bool:
        if offer.is_cpu:
            if not include_cpu or vendor or gpu_type or min_memory_gib:
                return False
        else:
            assert offer.gpu_type is not None  # a GPU offer
            if vendor and offer.gpu_type.vendor != vendor:
                return False
            if gpu_type and offer.gpu_type.slug != gpu_type:
                return False
            if min_memory_gib and offer.gpu_type.memory_gib < min_memory_gib:
                return False
        if region and offer.region.slug != region:
            return False
        if tier and offer.tier != tier:
            return False
        if interconnect and interconnect not in offer.interconnects:
            return False
        if cpu_arch and offer.cpu_arch != cpu_arch:
            return False
        return not (available_only and offer.available <= 0)

    return sorted(filter(keep, rows), key=SORTS.get(sort, SORTS["price"]))


# --- the catalog page's view of the offers ----

# "Save 55 %": whole percent, rounded half up (offers' micro-rounded prices would make a
# 55 % discount 54.9999 %).
WHOLE_PERCENT = Decimal(1)
HUNDRED = Decimal(100)
GROUP_SORTS = {
    "price": lambda g: (g.from_price, g.sort_label),
    "price_per_tflop": lambda g: (
        g.from_price_per_pflop_hour or Decimal("Infinity"), g.from_price, g.sort_label,
    ),
    "availability": lambda g: (-g.available, g.from_price, g.sort_label),
}  # fmt: skip


def spot_saving_percent(*, on_demand: Decimal, spot: Decimal) -> Decimal | None:
    """What spot saves against on-demand, in whole percent; None when it saves nothing."""
    if on_demand <= 0 or spot >= on_demand:
        return None
    saving = (on_demand - spot) * HUNDRED / on_demand
    return saving.quantize(WHOLE_PERCENT, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class OfferGroup:
    """One GPU type (or CPU) in one region with its tiers side by side: a row of the
    catalog. `cells` follow the tiers shown (None where the price book has no such offer);
    the spot saving compares spot with on-demand even when only one of them is shown."""

    gpu_type: GpuType | None
    region: Region
    tiers: tuple[Tier, ...]
    cells: tuple[Offer | None, ...]
    spot_saving_percent: Decimal | None

    @property
    def columns(self) -> list[tuple[Tier, Offer | None]]:
        """(tier, its offer or None) in the order of the table's columns."""
        return list(zip(self.tiers, self.cells, strict=True))

    @property
    def offers(self) -> list[Offer]:
        return [cell for cell in self.cells if cell is not None]

    @property
    def is_cpu(self) -> bool:
        return self.gpu_type is None

    @property
    def label(self) -> str:
        """ "a100-80gb|us-west": the group's handle in pages and tests."""
        return f"{self.gpu_type.slug if self.gpu_type else 'cpu'}|{self.region.slug}"

    @property
    def sort_label(self) -> tuple[str, str]:
        return (self.gpu_type.model if self.gpu_type else "", self.region.name)

    @property
    def available(self) -> int:
        return sum(offer.available for offer in self.offers)

    @property
    def from_price(self) -> Decimal:
        return min(offer.unit_price for offer in self.offers)

    @property
    def from_price_per_pflop_hour(self) -> Decimal | None:
        prices = [o.price_per_pflop_hour for o in self.offers if o.price_per_pflop_hour]
        return min(prices) if prices else None


@dataclass(frozen=True)
class OfferTable:
    """The catalog page's offers: the tier columns shown, then GPU and CPU groups."""

    tiers: list[Tier]
    gpu_groups: list[OfferGroup]
    cpu_groups: list[OfferGroup]


def offer_groups(
    offers: list[Offer],
    *,
    tier: str | None = None,
    available_only: bool = False,
    sort: str = "price",
) -> tuple[list[Tier], list[OfferGroup]]:
    """`offers` (of every tier) grouped by GPU type (or CPU) × region. The tiers shown
    are `tier` alone when given, else all, reserved only where the price book discounts
    it (else it is on-demand under another name). Groups with free capacity come
    first, then by `sort` (the cheapest tier shown, by default); `available_only`
    keeps only groups with free capacity in a tier shown."""
    by_group: dict[tuple[int | None, int], dict[str, Offer]] = {}
    for offer in offers:
        key = (offer.gpu_type.pk if offer.gpu_type else None, offer.region.pk)
        by_group.setdefault(key, {})[offer.tier] = offer
    if tier:
        tiers = [Tier(tier)]
    else:
        reserved_discounted = any(
            Tier.RESERVED in by_tier
            and Tier.ON_DEMAND in by_tier
            and by_tier[Tier.RESERVED].unit_price < by_tier[Tier.ON_DEMAND].unit_price
            for by_tier in by_group.values()
        )
        tiers = [t for t in Tier if t != Tier.RESERVED or reserved_discounted]
    groups = []
    for by_tier in by_group.values():
        cells = tuple(by_tier.get(t) for t in tiers)
        shown = [cell for cell in cells if cell is not None]
        if not shown or (available_only and not any(cell.available > 0 for cell in shown)):
            continue
        on_demand, spot = by_tier.get(Tier.ON_DEMAND), by_tier.get(Tier.SPOT)
        saving = None
        if on_demand is not None and spot is not None:
            saving = spot_saving_percent(on_demand=on_demand.unit_price, spot=spot.unit_price)
        groups.append(
            OfferGroup(
                gpu_type=shown[0].gpu_type,
                region=shown[0].region,
                tiers=tuple(tiers),
                cells=cells,
                spot_saving_percent=saving,
            )
        )
    order = GROUP_SORTS.get(sort, GROUP_SORTS["price"])
    groups.sort(key=lambda group: (group.available <= 0, *order(group)))
    return tiers, groups


def offer_table(
    *,
    tenant=None,
    vendor: str | None = None,
    gpu_type: str | None = None,
    min_memory_gib: int | None = None,
    region: str | None = None,
    tier: str | None = None,
    available_only: bool = False,
    sort: str = "price",
    interconnect: str | None = None,
    cpu_arch: str | None = None,
) -> OfferTable:
    """The catalog page's grouped offers under the page's filters (as `offers`)."""
    rows = offers(
        tenant=tenant,
        vendor=vendor,
        gpu_type=gpu_type,
        min_memory_gib=min_memory_gib,
        region=region,
        interconnect=interconnect,
        cpu_arch=cpu_arch,
    )
    tiers, groups = offer_groups(rows, tier=tier, available_only=available_only, sort=sort)
    return OfferTable(
        tiers=tiers,
        gpu_groups=[group for group in groups if not group.is_cpu],
        cpu_groups=[group for group in groups if group.is_cpu],
    )


def regions_active() -> QuerySet[Region]:
    return Region.objects.filter(is_active=True)


# --- who may use the console's own host ----

HOST_NOT_AVAILABLE = "This host is not available to this organisation."


def may_run_on_host(tenant: Tenant | None) -> bool:
    """Pools on the console's own machine (no security boundary) are for tenants staff
    allowed; nobody else, and no caller without a tenant, sees or uses them."""
    return tenant is not None and tenant.may_run_on_host


def pools_for_tenant(tenant: Tenant | None) -> QuerySet[NodePool]:
    """Active pools the tenant may see and launch on."""
    pools = NodePool.objects.filter(is_active=True)
    if not may_run_on_host(tenant):
        pools = pools.exclude(on_console_host=True)
    return pools


def launchable_pools(tenant: Tenant | None) -> QuerySet[NodePool]:
    """Active pools the tenant may launch on: usable by it, on one of this installation's
    compute backends."""
    return pools_for_tenant(tenant).filter(backend__in=settings.COMPUTE_BACKENDS)


# An offer's key: GPU type id (None: CPU), region id, tier.
OfferKey = tuple[int | None, int, str]


def launch_pools(
    *,
    tenant: Tenant | None,
    region: Region | None = None,
    requirements: dict[str, str] | None = None,
) -> dict[OfferKey, NodePool]:
    """The pool the nodes of each GPU type × region × tier launch on, in one read: of the
    launchable pools of that kind (that have what `requirements` ask, NodePool.
    requirement_refusal), the largest (most allocatable GPUs, vCPUs for CPU), then the
    oldest. The one rule for the launch's placement and the launch form's offers."""
    pools = launchable_pools(tenant).order_by("pk")
    if region is not None:
        pools = pools.filter(region=region)
    chosen: dict[OfferKey, NodePool] = {}
    for pool in pools:
        if requirements and pool.requirement_refusal(requirements):
            continue
        key = (pool.gpu_type_id, pool.region_id, pool.tier)
        best = chosen.get(key)
        if best is None or _pool_size(pool) > _pool_size(best):
            chosen[key] = pool
    return chosen


def _pool_size(pool: NodePool) -> int:
    return pool.allocatable_gpus if pool.gpu_type_id else pool.allocatable_vcpus


def image_hardware(gpu_type: GpuType | None) -> str:
    """What an image must list in `compatible_with` to run on `gpu_type` (None: CPU)."""
    return gpu_type.vendor if gpu_type else "cpu"


def host_only_region_ids(tenant: Tenant | None) -> QuerySet:
    """Ids of the regions hidden from the tenant: those whose only active pools are on the
    console's host, when the tenant may not run there. Empty for allowed tenants."""
    if may_run_on_host(tenant):
        return Region.objects.none().values_list("pk", flat=True)
    elsewhere = NodePool.objects.filter(is_active=True, on_console_host=False)
    return (
        NodePool.objects.filter(is_active=True, on_console_host=True)
        .exclude(region_id__in=elsewhere.values("region_id"))
        .values_list("region_id", flat=True)
    )


def regions_for_tenant(tenant: Tenant | None) -> QuerySet[Region]:
    """Active regions the tenant may choose (launch form, estimates, filters)."""
    return regions_active().exclude(pk__in=host_only_region_ids(tenant))


def default_region(tenant: Tenant | None = None, gpu_type: GpuType | None = None) -> Region | None:
    """Where a launch that names no region goes: an active region with an active pool of
    the GPU type (CPU-only for None), usable by the tenant, on one of the configured
    compute backends. A region where a real backend (this host, a real cluster) has
    capacity for it comes first, so that the user's command runs rather than the sandbox
    cluster's simulation; then the first by pk. None when no region qualifies."""
    pools = launchable_pools(tenant).filter(gpu_type=gpu_type)
    has_capacity = Q(total_gpus__gt=0) if gpu_type is not None else Q(allocatable_vcpus__gt=0)
    real = pools.filter(has_capacity, region=OuterRef("pk"), simulated=False)
    return (
        regions_active()
        .filter(pk__in=pools.values("region_id"))
        .annotate(has_real_pool=Exists(real))
        .order_by("-has_real_pool", "pk")
        .first()
    )


def gpu_type_names() -> dict[str, str]:
    """Each GPU type's display name ("A100 80GB SXM") by slug, withdrawn ones too (old
    usage names them)."""
    return dict(GpuType.objects.values_list("slug", "model"))


def gpu_type_colours(*, by_name: bool = False) -> dict[str, str]:
    """Each GPU type's chart colour, the same on every page: handed out in the order the
    types were created, so adding a type never recolours the others. By slug (and "cpu"),
    or by display name (and "CPU") for series already labelled with names."""
    types = GpuType.objects.order_by("pk").values_list("slug", "model")
    colours = {
        (model if by_name else slug): palette_colour(i) for i, (slug, model) in enumerate(types)
    }
    colours["CPU" if by_name else "cpu"] = CPU_COLOUR
    return colours


def price_currency() -> str:
    """The currency prices and job costs are in: the price book's in force (before the
    first one, the currency a price book starts in)."""
    book = price_book()
    if book is None:
        return str(PriceVersion._meta.get_field("currency").get_default())
    return book.version.currency


def images_for_tenant(
    *,
    tenant,
    query: str = "",
    kind: str = "",
    vendor: str = "",
    interactive: str = "",
    include_inactive: bool = False,
) -> QuerySet[Image]:
    """The images a tenant may run; `interactive` ("ssh" or "jupyter"): those serving it
    themselves (marked with it or "both")."""
    images = Image.objects.for_tenant(tenant)
    if not include_inactive:
        images = images.filter(is_active=True)
    if query:
        images = images.filter(
            Q(name__icontains=query)
            | Q(description__icontains=query)
            | Q(framework__icontains=query)
            | Q(slug__icontains=query)
        )
    if kind:
        images = images.filter(kind=kind)
    if interactive:
        images = images.filter(interactive__in=[interactive, ImageInteractive.BOTH])
    if vendor:
        # JSON list containment isn't portable to SQLite; filter the (small) catalog here.
        ids = [image.pk for image in images if vendor in image.compatible_with]
        images = images.filter(pk__in=ids)
    return images


def new_tenant_policy() -> NewTenantPolicy:
    """The policy for new organisations; its defaults where staff never saved one."""
    return NewTenantPolicy.objects.filter(pk=1).first() or NewTenantPolicy(pk=1)


def tenant_wide_quota(*, tenant: Tenant) -> TenantQuota | None:
    return TenantQuota.objects.for_tenant(tenant).filter(gpu_type=None).first()


def dashboard_limits_context(request: HttpRequest) -> dict[str, Any]:
    """The dashboard's "Your limits" panel where the organisation has a tenant-wide quota
    (registered with console.dashboard by the marketplace's receivers)."""
    tenant = getattr(request, "tenant", None)
    quota = tenant_wide_quota(tenant=tenant) if tenant is not None else None
    if quota is None or (quota.max_gpus is None and quota.max_concurrent_jobs is None):
        return {}
    return {
        "dashboard_panels": ["marketplace/partials/dashboard_limits.html"],
        "tenant_quota": quota,
    }


def price_versions() -> QuerySet[PriceVersion]:
    return PriceVersion.objects.select_related("created_by")


def registry_credentials_for_tenant(*, tenant) -> QuerySet[RegistryCredential]:
    return RegistryCredential.objects.for_tenant(tenant).select_related("created_by")


@dataclass(frozen=True)
class RegistryLogin:
    """Decrypted credentials for one registry; only ever handed to a compute backend."""

    registry: str
    username: str
    password: str = field(repr=False)


def registry_login_for_image(*, tenant, image_reference: str) -> RegistryLogin | None:
    """The tenant's login to the registry an image comes from, or None (public image,
    or no credentials stored)."""
    try:
        registry = parse_reference(image_reference).registry
    except InvalidReference:
        return None
    credential = RegistryCredential.objects.for_tenant(tenant).filter(registry=registry).first()
    if credential is None:
        return None
    password = decrypt_json(credential.password_encrypted)["password"]
    return RegistryLogin(registry=registry, username=credential.username, password=password)
