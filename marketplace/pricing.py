"""The one pricing rule: what a GPU (or CPU) configuration costs per hour and in total.

Pure: it reads the price book and the tenant's discount but never capacity or quota.
Nodes are whole: `node_split` is the one rule that turns a node count and a spot ratio
into spot and on-demand nodes, used by the estimate and by the launch (jobs' placement),
so that the estimate prices exactly the split that launches:
    hourly = units per node × (spot nodes × spot price + other nodes × base price)
where prices are after the tenant's discount and the base price is on-demand or, for the
reserved tier, reserved for the chosen term. Everything is Decimal at full precision;
money is rounded to the cent once, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from django.utils import timezone

from marketplace.models import GpuType, PriceEntry, PriceVersion, Region, TenantPricing, Tier

CENT = Decimal("0.01")
HUNDRED = Decimal(100)
RESERVED_TERMS = (1, 3, 12)
# The most nodes one job (and so one estimate) may ask for: the estimate form and API, the
# launch form and API, the job spec's validation and (as its own copy, checked equal by
# tests/sdk) the SDK and CLI.
MAX_NODES = 1024


class PricingError(Exception):
    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


def to_cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def _off(price: Decimal, percent: Decimal) -> Decimal:
    return price * (HUNDRED - percent) / HUNDRED


def after_tenant_discount(price: Decimal, discount_percent: Decimal) -> Decimal:
    """`price` after a tenant's negotiated discount (`tenant_discount_percent`): the one
    place it is applied, for estimates, offers, running jobs' rates and metering alike."""
    return _off(price, discount_percent)


@dataclass(frozen=True)
class UnitPrices:
    """Per GPU-hour (or vCPU-hour) prices of one offer in one price version, undiscounted."""

    version: PriceVersion
    on_demand: Decimal
    spot: Decimal
    reserved: dict[int, Decimal]

    @property
    def currency(self) -> str:
        return self.version.currency

    def for_tier(self, tier: str, reserved_months: int = 1) -> Decimal:
        if tier == Tier.SPOT:
            return self.spot
        if tier == Tier.RESERVED:
            return self.reserved[reserved_months]
        return self.on_demand


def unit_prices(entry: PriceEntry, version: PriceVersion) -> UnitPrices:
    od = entry.on_demand_price
    return UnitPrices(
        version=version,
        on_demand=od,
        spot=_off(od, version.spot_discount_percent),
        reserved={m: _off(od, version.reserved_discount(m)) for m in RESERVED_TERMS},
    )


def price_entry_in_force(
    *, gpu_type: GpuType | None, region: Region, at: datetime | None = None
) -> tuple[PriceVersion, PriceEntry]:
    version = PriceVersion.objects.in_force(at)
    if version is None:
        raise PricingError("No price book is in force yet.")
    entry = version.entries.filter(gpu_type=gpu_type, region=region).first()
    if entry is None:
        what = gpu_type.slug if gpu_type else "CPU"
        raise PricingError(f"{what} has no price in {region.slug}.", field="region")
    return version, entry


def tenant_discount_percent(tenant) -> Decimal:
    if tenant is None:
        return Decimal(0)
    pricing = TenantPricing.objects.for_tenant(tenant).first()
    return pricing.discount_percent if pricing else Decimal(0)


@dataclass(frozen=True)
class NodeSplit:
    """How many of a job's whole nodes go to spot and how many on-demand."""

    nodes: int
    spot_ratio: Decimal  # as asked
    spot_nodes: int
    on_demand_nodes: int

    @property
    def effective_spot_ratio(self) -> Decimal:
        return Decimal(self.spot_nodes) / Decimal(self.nodes)

    @property
    def honours_ratio(self) -> bool:
        """Whether whole nodes give exactly the ratio asked."""
        return self.effective_spot_ratio == self.spot_ratio

    @property
    def label(self) -> str:
        """ "1 node: spot", "6 spot + 2 on-demand nodes"."""
        if not self.spot_nodes or not self.on_demand_nodes:
            tier = "spot" if self.spot_nodes else "on-demand"
            return f"{self.nodes} node{'s' if self.nodes != 1 else ''}: {tier}"
        return f"{self.spot_nodes} spot + {self.on_demand_nodes} on-demand nodes"

    @property
    def note(self) -> str:
        """Why the split isn't the ratio asked ("" when it is)."""
        if self.honours_ratio:
            return ""
        share = (self.effective_spot_ratio * HUNDRED).quantize(Decimal(1), ROUND_HALF_UP)
        asked = (self.spot_ratio * HUNDRED).normalize()
        nodes = f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        return (
            f"A spot ratio of {asked:f} % can't be honoured with {nodes}: whole nodes give "
            f"{self.label} ({share} % spot)."
        )


def node_split(*, nodes: int, spot_ratio: Decimal, tier: str = Tier.ON_DEMAND) -> NodeSplit:
    """round(nodes × ratio) nodes on spot, halves up (a single node goes to spot at
    ratio ≥ 0.5), the rest on-demand; the spot tier puts every node on spot. The one
    rule for estimates and launches."""
    spot_ratio = Decimal(1) if tier == Tier.SPOT else Decimal(spot_ratio)
    spot_nodes = int((Decimal(nodes) * spot_ratio).quantize(Decimal(1), ROUND_HALF_UP))
    return NodeSplit(
        nodes=nodes,
        spot_ratio=spot_ratio,
        spot_nodes=spot_nodes,
        on_demand_nodes=nodes - spot_nodes,
    )


@dataclass(frozen=True)
class Estimate:
    hourly: Decimal
    total: Decimal
    currency: str
    spot_share: Decimal
    on_demand_share: Decimal
    price_version: int
    units: int
    unit: str
    unit_price_spot: Decimal
    unit_price_base: Decimal
    tenant_discount_percent: Decimal
    split: NodeSplit

    @property
    def spot_nodes(self) -> int:
        return self.split.spot_nodes

    @property
    def on_demand_nodes(self) -> int:
        return self.split.on_demand_nodes


def estimate_cost(
    *,
    gpu_type: GpuType | None,
    region: Region,
    nodes: int,
    gpus_per_node: int = 0,
    cpus: int = 0,
    spot_ratio: Decimal = Decimal(0),
    hours: Decimal = Decimal(1),
    tier: str = Tier.ON_DEMAND,
    reserved_months: int = 1,
    tenant=None,
    at: datetime | None = None,
) -> Estimate:
    spot_ratio = Decimal(spot_ratio)
    hours = Decimal(hours)
    if nodes < 1:
        raise PricingError("Ask for at least one node.", field="nodes")
    if nodes > MAX_NODES:
        raise PricingError(f"Ask for at most {MAX_NODES:,} nodes.", field="nodes")
    if not Decimal(0) <= spot_ratio <= Decimal(1):
        raise PricingError("The spot ratio is between 0 and 1.", field="spot_ratio")
    if hours <= 0:
        raise PricingError("Hours must be more than zero.", field="hours")
    if reserved_months not in RESERVED_TERMS:
        raise PricingError("Reserved terms are 1, 3 or 12 months.", field="reserved_months")
    if gpu_type is not None:
        if gpus_per_node < 1:
            raise PricingError("Ask for at least one GPU per node.", field="gpus_per_node")
        units_per_node, unit = gpus_per_node, "gpu_hour"
    else:
        if cpus < 1:
            raise PricingError("Ask for at least one vCPU per node.", field="cpus")
        units_per_node, unit = cpus, "vcpu_hour"
    split = node_split(nodes=nodes, spot_ratio=spot_ratio, tier=tier)

    version, entry = price_entry_in_force(gpu_type=gpu_type, region=region, at=at or timezone.now())
    prices = unit_prices(entry, version)
    discount = tenant_discount_percent(tenant)
    spot_price = after_tenant_discount(prices.spot, discount)
    base_price = after_tenant_discount(prices.for_tier(tier, reserved_months), discount)

    spot_hourly = units_per_node * split.spot_nodes * spot_price
    base_hourly = units_per_node * split.on_demand_nodes * base_price
    total = to_cents((spot_hourly + base_hourly) * hours)
    spot_share = to_cents(spot_hourly * hours)
    return Estimate(
        hourly=to_cents(spot_hourly + base_hourly),
        total=total,
        currency=version.currency,
        spot_share=spot_share,
        on_demand_share=total - spot_share,
        price_version=version.pk,
        units=units_per_node * nodes,
        unit=unit,
        unit_price_spot=spot_price,
        unit_price_base=base_price,
        tenant_discount_percent=discount,
        split=split,
    )
