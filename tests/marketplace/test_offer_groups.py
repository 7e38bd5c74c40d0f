"""The catalog page's grouped offers: GPU type × region rows with the tiers side by
side, the spot saving, available groups first, then by price."""

from __future__ import annotations

from decimal import Decimal

import pytest

from marketplace import selectors
from marketplace.models import GpuType, NodePool, PriceVersion, Region, Tier
from marketplace.selectors import Offer, offer_groups, spot_saving_percent
from tests.factories import NodePoolFactory

D = Decimal
WEST = Region(pk=1, slug="us-west", name="US West")
EAST = Region(pk=2, slug="us-east", name="US East")
A100 = GpuType(pk=1, slug="a100-80gb", model="A100 80GB", memory_gib=80, peak_tflops=D(312))
H100 = GpuType(pk=2, slug="h100-80gb", model="H100 80GB", memory_gib=80, peak_tflops=D(989))


def offer(gpu, region, tier, price, available=0, total=8) -> Offer:
    return Offer(
        gpu_type=gpu,
        region=region,
        tier=tier,
        unit_price=D(price),
        currency="USD",
        available=available,
        total=total,
        vcpus_per_node=0,
        memory_gib_per_node=0,
        price_version=1,
    )


def three_tiers(gpu, region, on_demand, available=(0, 0, 0)) -> list[Offer]:
    """On-demand at `on_demand`, spot 55 % off, reserved 15 % off."""
    price = D(on_demand)
    return [
        offer(gpu, region, Tier.ON_DEMAND, price, available[0]),
        offer(gpu, region, Tier.SPOT, price * D("0.45"), available[1]),
        offer(gpu, region, Tier.RESERVED, price * D("0.85"), available[2]),
    ]


@pytest.mark.parametrize(
    ("on_demand", "spot", "saving"),
    [
        ("1.790000", "0.805500", D(55)),
        ("1.00", "0.38", D(62)),
        ("1.00", "0.385", D(62)),  # 61.5 rounds half up
        ("3.00", "1.015", D(66)),  # 66.17
        ("1.611000", "0.724950", D(55)),  # after a tenant's 10 % discount
        ("1.00", "1.00", None),
        ("0", "0", None),
    ],
)
def test_spot_saving_is_a_whole_percent_of_on_demand(on_demand, spot, saving):
    result = spot_saving_percent(on_demand=D(on_demand), spot=D(spot))
    assert result == saving
    assert result is None or isinstance(result, Decimal)


def test_offers_are_grouped_by_gpu_type_and_region_with_the_tiers_side_by_side():
    rows = three_tiers(A100, WEST, "1.79", (8, 0, 0)) + three_tiers(H100, WEST, "2.99", (0, 4, 0))
    rows += three_tiers(A100, EAST, "1.79", (0, 0, 16))

    tiers, groups = offer_groups(rows)

    assert tiers == [Tier.ON_DEMAND, Tier.SPOT, Tier.RESERVED]
    assert [g.label for g in groups] == [
        "a100-80gb|us-east",
        "a100-80gb|us-west",
        "h100-80gb|us-west",
    ]
    west = groups[1]
    assert [(t, c.unit_price if c else None) for t, c in west.columns] == [
        (Tier.ON_DEMAND, D("1.79")),
        (Tier.SPOT, D("0.8055")),
        (Tier.RESERVED, D("1.5215")),
    ]
    assert west.spot_saving_percent == D(55)
    assert west.available == 8
    assert west.from_price == D("0.8055")


def test_available_groups_come_first_then_the_cheapest():
    cheap_but_full = three_tiers(A100, WEST, "1.00")
    dear_and_free = three_tiers(H100, WEST, "3.00", (8, 0, 0))
    middling_and_free = three_tiers(A100, EAST, "2.00", (0, 8, 0))

    _, groups = offer_groups(cheap_but_full + dear_and_free + middling_and_free)

    assert [g.label for g in groups] == [
        "a100-80gb|us-east",
        "h100-80gb|us-west",
        "a100-80gb|us-west",
    ]
    assert [g.available > 0 for g in groups] == [True, True, False]


def test_most_available_sort_keeps_available_first():
    few = three_tiers(A100, WEST, "1.00", (2, 0, 0))
    many = three_tiers(H100, WEST, "3.00", (8, 8, 0))
    none = three_tiers(A100, EAST, "0.50")

    _, groups = offer_groups(few + many + none, sort="availability")

    assert [g.label for g in groups] == [
        "h100-80gb|us-west",
        "a100-80gb|us-west",
        "a100-80gb|us-east",
    ]


def test_a_tier_filter_shows_that_tier_alone_and_keeps_the_saving():
    rows = three_tiers(A100, WEST, "1.79", (0, 8, 0))

    tiers, groups = offer_groups(rows, tier=Tier.SPOT)

    assert tiers == [Tier.SPOT]
    assert [c.tier for c in groups[0].offers] == [Tier.SPOT]
    assert groups[0].spot_saving_percent == D(55)


def test_available_only_counts_the_tiers_shown():
    rows = three_tiers(A100, WEST, "1.79", (0, 8, 0)) + three_tiers(H100, WEST, "2.99", (4, 0, 0))

    _, on_demand_free = offer_groups(rows, tier=Tier.ON_DEMAND, available_only=True)
    _, any_free = offer_groups(rows, available_only=True)

    assert [g.label for g in on_demand_free] == ["h100-80gb|us-west"]
    assert {g.label for g in any_free} == {"a100-80gb|us-west", "h100-80gb|us-west"}


def test_reserved_is_shown_only_where_the_price_book_discounts_it():
    rows = [
        offer(A100, WEST, Tier.ON_DEMAND, "1.79"),
        offer(A100, WEST, Tier.SPOT, "0.8055"),
        offer(A100, WEST, Tier.RESERVED, "1.79"),  # no reserved discount
    ]

    tiers, groups = offer_groups(rows)

    assert tiers == [Tier.ON_DEMAND, Tier.SPOT]
    assert len(groups[0].cells) == 2


def test_offer_table_from_the_catalog(catalog, world):
    table = selectors.offer_table(tenant=world.tenant)

    flat = selectors.offers(tenant=world.tenant)
    gpu_keys = {(o.gpu_label, o.region.slug) for o in flat if not o.is_cpu}
    assert len(table.gpu_groups) == len(gpu_keys) < len(flat) / 2
    assert all(g.is_cpu for g in table.cpu_groups) and table.cpu_groups
    assert table.tiers == [Tier.ON_DEMAND, Tier.SPOT, Tier.RESERVED]
    version = PriceVersion.objects.in_force()
    assert version is not None
    assert {g.spot_saving_percent for g in table.gpu_groups} == {version.spot_discount_percent}
    # "Launch this" takes the node size of the pool the launch would use.
    west = next(g for g in table.gpu_groups if g.label == "a100-80gb|us-west")
    spot = dict(west.columns)[Tier.SPOT]
    assert spot is not None
    pool = NodePool.objects.get(
        gpu_type__slug="a100-80gb", region__slug="us-west", tier=Tier.SPOT, is_active=True
    )
    assert spot.gpus_per_node == pool.gpus_per_node > 0
    flags = [g.available > 0 for g in table.gpu_groups]
    assert flags == sorted(flags, reverse=True)


def test_offer_table_filters(catalog, world):
    table = selectors.offer_table(
        tenant=world.tenant, gpu_type="a100-80gb", tier=Tier.SPOT, available_only=True
    )

    assert table.tiers == [Tier.SPOT]
    assert table.gpu_groups and all(g.label.startswith("a100-80gb|") for g in table.gpu_groups)
    assert all(g.available > 0 for g in table.gpu_groups)
    assert table.cpu_groups == []  # a GPU type filter leaves CPU out


def test_launch_node_size_is_that_of_the_pool_with_the_most_free_gpus(catalog, world):
    west = Region.objects.get(slug="us-west")
    a100 = GpuType.objects.get(slug="a100-80gb")
    NodePool.objects.filter(region=west, gpu_type=a100, tier=Tier.SPOT).update(in_use_gpus=28)
    NodePoolFactory(
        slug="us-west-a100-spot-small",
        region=west,
        gpu_type=a100,
        tier=Tier.SPOT,
        backend="kubernetes",
        node_count=4,
        gpus_per_node=2,
    )

    spot = next(
        o
        for o in selectors.offers(tenant=world.tenant, gpu_type="a100-80gb", region="us-west")
        if o.tier == Tier.SPOT
    )

    assert spot.gpus_per_node == 2  # 8 free on the small nodes, fewer on the big ones
    assert spot.available == 8 + 32 - 28
