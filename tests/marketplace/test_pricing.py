"""estimate_cost, the one pricing rule: hand-checked figures from the demo price book,
field errors, and property tests (monotonic, spot never costs more, cents only at the end).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marketplace import services
from marketplace.demo import GPU_TYPES, REGIONS
from marketplace.models import GpuType, PriceVersion, Region, Tier
from marketplace.pricing import PricingError, estimate_cost

D = Decimal
CENT = D("0.01")
# The demo price book, straight from the seed data (not from the database).
ON_DEMAND = {
    (row[0], region): row[-1] * factor for row in GPU_TYPES for region, _, factor in REGIONS
}
SPOT_DISCOUNT = D(55)
RESERVED_DISCOUNT = {1: D(15), 3: D(25), 12: D(40)}
DEMO_REGIONS = ["us-west", "us-east", "eu-central"]


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def assert_money(value: Decimal) -> None:
    assert isinstance(value, Decimal)
    assert value.as_tuple().exponent == -2, value


def assert_well_formed(estimate) -> None:
    for amount in (estimate.hourly, estimate.total, estimate.spot_share, estimate.on_demand_share):
        assert_money(amount)
    assert estimate.spot_share + estimate.on_demand_share == estimate.total


# --- hand-checked figures ----


def test_seed_example_8_a100_80gb_us_west_70_percent_spot(catalog):
    # on-demand 1.79, spot 1.79 × 0.45 = 0.8055
    # hourly = 8 × (0.7 × 0.8055 + 0.3 × 1.79) = 8 × 1.10085 = 8.8068 → 8.81
    # 24 h: 8.8068 × 24 = 211.3632 → 211.36 (not 8.81 × 24 = 211.44)
    # spot share 8 × 0.7 × 0.8055 × 24 = 108.2592 → 108.26; on-demand 211.36 − 108.26
    estimate = estimate_cost(
        gpu_type=catalog.gpu("a100-80gb"),
        region=catalog.region("us-west"),
        nodes=1,
        gpus_per_node=8,
        spot_ratio=D("0.7"),
        hours=D(24),
    )

    assert estimate.hourly == D("8.81")
    assert estimate.total == D("211.36")
    assert estimate.spot_share == D("108.26")
    assert estimate.on_demand_share == D("103.10")
    assert estimate.currency == "USD"
    assert estimate.price_version == catalog.version.pk
    assert (estimate.units, estimate.unit) == (8, "gpu_hour")
    assert estimate.unit_price_spot == D("0.8055")
    assert estimate.unit_price_base == D("1.79")
    assert_well_formed(estimate)


def test_nodes_multiply_like_gpus(catalog):
    two_by_four = estimate_cost(
        gpu_type=catalog.gpu("a100-80gb"),
        region=catalog.region("us-west"),
        nodes=2,
        gpus_per_node=4,
        spot_ratio=D("0.7"),
        hours=D(24),
    )
    assert (two_by_four.hourly, two_by_four.total) == (D("8.81"), D("211.36"))


def test_cpu_estimate_prices_vcpus(catalog):
    # 2 nodes × 16 vCPUs × 0.0125 = 0.40 an hour; eu-central is 10 % dearer: 0.44.
    cpu_price = catalog.version.entries.get(gpu_type=None, region__slug="us-west")
    assert cpu_price.on_demand_price == D("0.0125")
    estimate = estimate_cost(
        gpu_type=None, region=catalog.region("us-west"), nodes=2, cpus=16, hours=D(10)
    )
    assert (estimate.units, estimate.unit) == (32, "vcpu_hour")
    assert (estimate.hourly, estimate.total) == (D("0.40"), D("4.00"))
    assert estimate.spot_share == D("0.00")
    assert_well_formed(estimate)
    eu = estimate_cost(gpu_type=None, region=catalog.region("eu-central"), nodes=2, cpus=16)
    assert eu.hourly == D("0.44")


@pytest.mark.parametrize(
    ("months", "hourly", "total"),
    [
        (1, D("12.17"), D("292.13")),  # 8 × 1.79 × 0.85 = 12.172 → ×24 = 292.128
        (3, D("10.74"), D("257.76")),  # 8 × 1.79 × 0.75 = 10.74 → ×24 = 257.76
        (12, D("8.59"), D("206.21")),  # 8 × 1.79 × 0.60 = 8.592 → ×24 = 206.208
    ],
)
def test_reserved_tier_uses_the_term_discount(catalog, months, hourly, total):
    estimate = estimate_cost(
        gpu_type=catalog.gpu("a100-80gb"),
        region=catalog.region("us-west"),
        nodes=1,
        gpus_per_node=8,
        hours=D(24),
        tier=Tier.RESERVED,
        reserved_months=months,
    )
    assert (estimate.hourly, estimate.total) == (hourly, total)
    assert_well_formed(estimate)


def test_reserved_tier_with_spot_share_blends_spot_and_reserved(catalog):
    # 8 × (0.5 × 0.8055 + 0.5 × 1.074) = 7.5180
    estimate = estimate_cost(
        gpu_type=catalog.gpu("a100-80gb"),
        region=catalog.region("us-west"),
        nodes=1,
        gpus_per_node=8,
        spot_ratio=D("0.5"),
        tier=Tier.RESERVED,
        reserved_months=12,
    )
    assert estimate.hourly == D("7.52")


def test_spot_tier_is_all_spot(catalog):
    estimate = estimate_cost(
        gpu_type=catalog.gpu("a100-80gb"),
        region=catalog.region("us-west"),
        nodes=1,
        gpus_per_node=8,
        tier=Tier.SPOT,
    )
    assert estimate.hourly == D("6.44")  # 8 × 0.8055 = 6.444
    assert estimate.spot_share == estimate.total


def test_tenant_discount_applies_to_that_tenant_only(catalog, world, other_world):
    services.tenant_pricing_set(
        tenant=world.tenant, discount_percent=D(10), note="launch deal", user=world.owner
    )
    kwargs = {
        "gpu_type": catalog.gpu("a100-80gb"),
        "region": catalog.region("us-west"),
        "nodes": 1,
        "gpus_per_node": 8,
        "spot_ratio": D("0.7"),
    }
    # 8.8068 × 0.9 = 7.92612
    discounted = estimate_cost(tenant=world.tenant, **kwargs)
    assert discounted.hourly == D("7.93")
    assert discounted.tenant_discount_percent == D(10)
    assert estimate_cost(tenant=other_world.tenant, **kwargs).hourly == D("8.81")
    assert estimate_cost(tenant=None, **kwargs).hourly == D("8.81")


def test_an_estimate_never_checks_capacity_or_quota(catalog, world):
    services.tenant_quota_set(
        tenant=world.tenant,
        gpu_type=catalog.gpu("mi250"),
        max_gpus=0,
        max_concurrent_jobs=None,
        user=world.owner,
    )
    services.tenant_quota_set(
        tenant=world.tenant, gpu_type=None, max_gpus=0, max_concurrent_jobs=0, user=world.owner
    )
    # No MI250 pool in us-west at all, and far more GPUs than any pool has.
    estimate = estimate_cost(
        gpu_type=catalog.gpu("mi250"),
        region=catalog.region("us-west"),
        nodes=512,
        gpus_per_node=8,
        tenant=world.tenant,
    )
    assert estimate.hourly == D("4874.24")  # 4096 × 1.19


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"nodes": 0}, "nodes"),
        ({"nodes": -1}, "nodes"),
        ({"spot_ratio": D("-0.01")}, "spot_ratio"),
        ({"spot_ratio": D("1.01")}, "spot_ratio"),
        ({"hours": D(0)}, "hours"),
        ({"hours": D("-1")}, "hours"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"reserved_months": 6}, "reserved_months"),
    ],
)
def test_invalid_estimates_name_the_field(catalog, overrides, field):
    kwargs = {
        "gpu_type": catalog.gpu("a100-80gb"),
        "region": catalog.region("us-west"),
        "nodes": 1,
        "gpus_per_node": 8,
        **overrides,
    }
    with pytest.raises(PricingError) as raised:
        estimate_cost(**kwargs)
    assert raised.value.field == field


def test_cpu_estimate_without_cpus_is_refused(catalog):
    with pytest.raises(PricingError) as raised:
        estimate_cost(gpu_type=None, region=catalog.region("us-west"), nodes=1)
    assert raised.value.field == "cpus"


def test_unpriced_region_is_a_field_error(catalog):
    catalog.version.entries.filter(gpu_type__slug="l4", region__slug="us-west").delete()
    with pytest.raises(PricingError) as raised:
        estimate_cost(
            gpu_type=catalog.gpu("l4"), region=catalog.region("us-west"), nodes=1, gpus_per_node=1
        )
    assert raised.value.field == "region"


def test_no_price_book_in_force_is_an_error(catalog):
    PriceVersion.objects.all().delete()
    with pytest.raises(PricingError):
        estimate_cost(gpu_type=None, region=catalog.region("us-west"), nodes=1, cpus=1)


# --- properties ----

PROPERTY_SETTINGS = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
gpu_slugs = st.sampled_from([row[0] for row in GPU_TYPES])
regions = st.sampled_from(DEMO_REGIONS)
ratios = st.decimals(min_value=0, max_value=1, places=3)
hours_st = st.decimals(min_value=D("0.01"), max_value=D(2000), places=2)
tiers = st.sampled_from([Tier.ON_DEMAND, Tier.RESERVED])
terms = st.sampled_from([1, 3, 12])


def _estimate(lookup, slug, region, **kwargs):
    return estimate_cost(gpu_type=lookup[slug], region=lookup[region], **kwargs)


@pytest.fixture
def lookup(catalog):
    """GPU types and regions by slug, fetched once per test (not per example)."""
    rows = {g.slug: g for g in GpuType.objects.all()}
    rows.update({r.slug: r for r in Region.objects.all()})
    return rows


@PROPERTY_SETTINGS
@given(
    slug=gpu_slugs,
    region=regions,
    gpus=st.tuples(st.integers(1, 16), st.integers(1, 16)).map(sorted),
    nodes=st.tuples(st.integers(1, 64), st.integers(1, 64)).map(sorted),
    ratio=ratios,
    hours=hours_st,
    tier=tiers,
    months=terms,
)
def test_more_gpus_or_nodes_never_cost_less(
    lookup, slug, region, gpus, nodes, ratio, hours, tier, months
):
    common = {"spot_ratio": ratio, "hours": hours, "tier": tier, "reserved_months": months}
    small = _estimate(lookup, slug, region, nodes=nodes[0], gpus_per_node=gpus[0], **common)
    more_gpus = _estimate(lookup, slug, region, nodes=nodes[0], gpus_per_node=gpus[1], **common)
    more_nodes = _estimate(lookup, slug, region, nodes=nodes[1], gpus_per_node=gpus[0], **common)
    assert small.total <= more_gpus.total
    assert small.total <= more_nodes.total
    assert small.hourly <= more_gpus.hourly
    assert small.hourly <= more_nodes.hourly


@PROPERTY_SETTINGS
@given(
    slug=gpu_slugs,
    region=regions,
    gpus=st.integers(1, 16),
    nodes=st.integers(1, 64),
    ratio=ratios,
    hours=st.tuples(hours_st, hours_st).map(sorted),
    tier=tiers,
)
def test_more_hours_never_cost_less(lookup, slug, region, gpus, nodes, ratio, hours, tier):
    common = {"nodes": nodes, "gpus_per_node": gpus, "spot_ratio": ratio, "tier": tier}
    shorter = _estimate(lookup, slug, region, hours=hours[0], **common)
    longer = _estimate(lookup, slug, region, hours=hours[1], **common)
    assert shorter.total <= longer.total
    assert shorter.hourly == longer.hourly


@PROPERTY_SETTINGS
@given(
    slug=gpu_slugs,
    region=regions,
    gpus=st.integers(1, 16),
    nodes=st.integers(1, 64),
    ratios_=st.tuples(ratios, ratios).map(sorted),
    hours=hours_st,
    tier=tiers,
    months=terms,
)
def test_more_spot_never_costs_more(
    lookup, slug, region, gpus, nodes, ratios_, hours, tier, months
):
    common = {
        "nodes": nodes,
        "gpus_per_node": gpus,
        "hours": hours,
        "tier": tier,
        "reserved_months": months,
    }
    less_spot = _estimate(lookup, slug, region, spot_ratio=ratios_[0], **common)
    more_spot = _estimate(lookup, slug, region, spot_ratio=ratios_[1], **common)
    assert more_spot.total <= less_spot.total
    assert more_spot.hourly <= less_spot.hourly
    assert more_spot.spot_share >= less_spot.spot_share


@PROPERTY_SETTINGS
@given(
    slug=gpu_slugs,
    region=regions,
    gpus=st.integers(1, 16),
    nodes=st.integers(1, 64),
    ratio=ratios,
    hours=hours_st,
    tier=tiers,
    months=terms,
)
def test_money_is_rounded_to_the_cent_only_at_the_end(
    lookup, slug, region, gpus, nodes, ratio, hours, tier, months
):
    estimate = _estimate(
        lookup,
        slug,
        region,
        nodes=nodes,
        gpus_per_node=gpus,
        spot_ratio=ratio,
        hours=hours,
        tier=tier,
        reserved_months=months,
    )

    on_demand = ON_DEMAND[(slug, region)]
    spot = on_demand * (100 - SPOT_DISCOUNT) / 100
    base = (
        on_demand if tier == Tier.ON_DEMAND else on_demand * (100 - RESERVED_DISCOUNT[months]) / 100
    )
    units = gpus * nodes
    unrounded_hourly = units * (ratio * spot + (1 - ratio) * base)
    assert estimate.hourly == cents(unrounded_hourly)
    assert estimate.total == cents(unrounded_hourly * hours)
    assert estimate.spot_share == cents(units * ratio * spot * hours)
    assert_well_formed(estimate)
