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
from marketplace.pricing import PricingError, estimate_cost, node_split

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
    # One node of 8 GPUs can't be 70 % spot: whole nodes put it on spot (round(0.7) = 1),
    # and the estimate prices that: 8 × 0.8055 = 6.444 → 6.44, as the launch charges.
    estimate = estimate_cost(
        gpu_type=catalog.gpu("a100-80gb"),
        region=catalog.region("us-west"),
        nodes=1,
        gpus_per_node=8,
        spot_ratio=D("0.7"),
        hours=D(24),
    )

    assert (estimate.spot_nodes, estimate.on_demand_nodes) == (1, 0)
    assert estimate.split.label == "1 node: spot"
    assert estimate.split.note == (
        "A spot ratio of 70 % can't be honoured with 1 node: whole nodes give "
        "1 node: spot (100 % spot)."
    )
    assert estimate.hourly == D("6.44")
    assert estimate.total == D("154.66")  # 6.444 × 24 = 154.656
    assert estimate.spot_share == estimate.total
    assert estimate.currency == "USD"
    assert estimate.price_version == catalog.version.pk
    assert (estimate.units, estimate.unit) == (8, "gpu_hour")
    assert estimate.unit_price_spot == D("0.8055")
    assert estimate.unit_price_base == D("1.79")
    assert_well_formed(estimate)


def test_ten_nodes_at_70_percent_spot_are_7_spot_and_3_on_demand(catalog):
    # on-demand 1.79, spot 1.79 × 0.45 = 0.8055
    # hourly = 8 × (7 × 0.8055 + 3 × 1.79) = 8 × 11.0085 = 88.068 → 88.07
    # 24 h: 88.068 × 24 = 2113.632 → 2113.63 (not 88.07 × 24 = 2113.68)
    # spot share 8 × 7 × 0.8055 × 24 = 1082.592 → 1082.59; on-demand 2113.63 − 1082.59
    estimate = estimate_cost(
        gpu_type=catalog.gpu("a100-80gb"),
        region=catalog.region("us-west"),
        nodes=10,
        gpus_per_node=8,
        spot_ratio=D("0.7"),
        hours=D(24),
    )
    assert (estimate.spot_nodes, estimate.on_demand_nodes) == (7, 3)
    assert estimate.split.label == "7 spot + 3 on-demand nodes"
    assert estimate.split.note == ""
    assert (estimate.hourly, estimate.total) == (D("88.07"), D("2113.63"))
    assert estimate.spot_share == D("1082.59")
    assert estimate.on_demand_share == D("1031.04")
    assert_well_formed(estimate)


def test_nodes_multiply_like_gpus_within_one_tier(catalog):
    common = {
        "gpu_type": catalog.gpu("a100-80gb"),
        "region": catalog.region("us-west"),
        "hours": D(24),
    }
    for ratio in (D(0), D(1)):
        two_by_four = estimate_cost(nodes=2, gpus_per_node=4, spot_ratio=ratio, **common)
        one_by_eight = estimate_cost(nodes=1, gpus_per_node=8, spot_ratio=ratio, **common)
        assert (two_by_four.hourly, two_by_four.total) == (
            one_by_eight.hourly,
            one_by_eight.total,
        )
    # Across tiers the split is by whole nodes: 2 × 4 at 0.7 is 1 spot + 1 on-demand node
    # (4 × (0.8055 + 1.79) = 10.382), 1 × 8 is one spot node (6.444).
    mixed = estimate_cost(nodes=2, gpus_per_node=4, spot_ratio=D("0.7"), **common)
    assert (mixed.spot_nodes, mixed.on_demand_nodes, mixed.hourly) == (1, 1, D("10.38"))


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
    # 1 spot + 1 reserved node of 4 GPUs: 4 × (0.8055 + 1.074) = 7.5180
    estimate = estimate_cost(
        gpu_type=catalog.gpu("a100-80gb"),
        region=catalog.region("us-west"),
        nodes=2,
        gpus_per_node=4,
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
        "nodes": 10,
        "gpus_per_node": 8,
        "spot_ratio": D("0.7"),
    }
    # 7 spot + 3 on-demand nodes: 88.068 × 0.9 = 79.2612
    discounted = estimate_cost(tenant=world.tenant, **kwargs)
    assert discounted.hourly == D("79.26")
    assert discounted.tenant_discount_percent == D(10)
    assert estimate_cost(tenant=other_world.tenant, **kwargs).hourly == D("88.07")
    assert estimate_cost(tenant=None, **kwargs).hourly == D("88.07")


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
    # Whole nodes: round(nodes × ratio), halves up, on spot (`node_split`).
    spot_nodes = int((nodes * ratio).quantize(D(1), rounding=ROUND_HALF_UP))
    unrounded_hourly = gpus * (spot_nodes * spot + (nodes - spot_nodes) * base)
    assert estimate.hourly == cents(unrounded_hourly)
    assert estimate.total == cents(unrounded_hourly * hours)
    assert estimate.spot_share == cents(gpus * spot_nodes * spot * hours)
    assert_well_formed(estimate)


# --- the split rule, shared by the estimate and the launch ----


@pytest.mark.parametrize(
    ("nodes", "ratio", "tier", "split", "label"),
    [
        (1, "0.7", Tier.ON_DEMAND, (1, 0), "1 node: spot"),
        (1, "0.4", Tier.ON_DEMAND, (0, 1), "1 node: on-demand"),
        (8, "0.75", Tier.ON_DEMAND, (6, 2), "6 spot + 2 on-demand nodes"),
        (8, "0", Tier.RESERVED, (0, 8), "8 nodes: on-demand"),
        (3, "0", Tier.SPOT, (3, 0), "3 nodes: spot"),  # the spot tier is all spot
    ],
)
def test_node_split_in_whole_nodes(nodes, ratio, tier, split, label):
    result = node_split(nodes=nodes, spot_ratio=D(ratio), tier=tier)
    assert (result.spot_nodes, result.on_demand_nodes) == split
    assert result.label == label


def test_a_ratio_whole_nodes_honour_has_no_note():
    assert node_split(nodes=8, spot_ratio=D("0.75")).note == ""
    note = node_split(nodes=8, spot_ratio=D("0.7")).note
    assert note == (
        "A spot ratio of 70 % can't be honoured with 8 nodes: whole nodes give "
        "6 spot + 2 on-demand nodes (75 % spot)."
    )


@given(
    nodes=st.integers(min_value=1, max_value=4096),
    ratio=ratios,
    tier=st.sampled_from(Tier.values),
)
def test_node_split_covers_the_nodes(nodes, ratio, tier):
    split = node_split(nodes=nodes, spot_ratio=ratio, tier=tier)
    assert split.spot_nodes + split.on_demand_nodes == nodes
    assert 0 <= split.spot_nodes <= nodes
    if tier == Tier.SPOT:
        assert split.spot_nodes == nodes
    else:
        assert abs(split.spot_nodes - nodes * ratio) <= D("0.5")
    assert split.honours_ratio == (split.spot_nodes == nodes * split.spot_ratio)


@PROPERTY_SETTINGS
@given(
    slug=gpu_slugs,
    region=regions,
    gpus=st.integers(1, 16),
    nodes=st.integers(1, 64),
    ratio=ratios,
    tier=st.sampled_from(Tier.values),
    months=terms,
)
def test_estimate_is_the_sum_of_its_split_priced_per_tier(
    lookup, slug, region, gpus, nodes, ratio, tier, months
):
    estimate = _estimate(
        lookup,
        slug,
        region,
        nodes=nodes,
        gpus_per_node=gpus,
        spot_ratio=ratio,
        tier=tier,
        reserved_months=months,
    )
    split = node_split(nodes=nodes, spot_ratio=ratio, tier=tier)
    assert (estimate.spot_nodes, estimate.on_demand_nodes) == (
        split.spot_nodes,
        split.on_demand_nodes,
    )
    per_tier = gpus * (
        split.spot_nodes * estimate.unit_price_spot
        + split.on_demand_nodes * estimate.unit_price_base
    )
    assert estimate.hourly == cents(per_tier)
