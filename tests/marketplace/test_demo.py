"""The demo catalog (marketplace.demo.seed_catalog): what the issue promises a fresh
install shows, and that seeding twice changes nothing."""

from __future__ import annotations

from decimal import Decimal

from marketplace.demo import seed_catalog
from marketplace.images import parse_reference
from marketplace.models import (
    GpuType,
    Image,
    ImageKind,
    NodePool,
    PriceEntry,
    PriceVersion,
    Region,
    Tier,
)
from marketplace.pricing import unit_prices
from marketplace.selectors import offers

GPU_SLUGS = {
    "a100-40gb",
    "a100-80gb",
    "h100-80gb",
    "h200-141gb",
    "l40s",
    "l4",
    "rtx-4090",
    "mi250",
    "mi300x",
    "ascend-910b",
}
REGIONS = {"us-west", "us-east", "eu-central"}


def test_demo_catalog_has_the_promised_gpu_types_regions_and_tiers(catalog):
    assert set(GpuType.objects.values_list("slug", flat=True)) >= GPU_SLUGS
    assert set(Region.objects.values_list("slug", flat=True)) >= REGIONS
    assert set(Tier.values) == {"on_demand", "spot", "reserved"}
    rows = offers()
    for region in REGIONS:
        for tier in Tier.values:
            assert any(o.region.slug == region and o.tier == tier for o in rows), (region, tier)
    # Every GPU type is priced in every demo region.
    priced = set(
        PriceEntry.objects.filter(version=catalog.version, gpu_type__isnull=False).values_list(
            "gpu_type__slug", "region__slug"
        )
    )
    assert {(g, r) for g in GPU_SLUGS for r in REGIONS} <= priced


def test_demo_catalog_has_images_of_all_three_kinds(catalog):
    images = Image.objects.for_tenant(None)
    assert images.count() >= 8
    assert set(images.values_list("kind", flat=True)) == set(ImageKind.values)
    assert set(ImageKind.values) == {"base", "framework", "full_stack"}


def test_every_spot_price_is_strictly_below_on_demand(catalog):
    entries = catalog.version.entries.all()
    assert entries
    for entry in entries:
        prices = unit_prices(entry, catalog.version)
        assert prices.spot < prices.on_demand, entry
    for on_demand in offers(tier=Tier.ON_DEMAND):
        spot = next(
            o
            for o in offers(tier=Tier.SPOT, region=on_demand.region.slug)
            if o.gpu_type == on_demand.gpu_type
        )
        assert spot.unit_price < on_demand.unit_price


def test_cpu_offers_are_priced_above_zero(catalog):
    cpu = [o for o in offers() if o.is_cpu]
    assert {o.region.slug for o in cpu} >= REGIONS
    assert all(o.unit_price > 0 for o in cpu)
    # ... and the demo fleet has CPU capacity to offer.
    assert any(o.available > 0 for o in cpu if o.tier == Tier.ON_DEMAND)


def test_the_seed_example_prices(catalog):
    entry = catalog.version.entries.get(gpu_type__slug="a100-80gb", region__slug="us-west")
    assert entry.on_demand_price == Decimal("1.79")
    assert unit_prices(entry, catalog.version).spot == Decimal("0.8055")


def test_seeding_twice_changes_nothing(catalog):
    counts = (
        GpuType.objects.count(),
        Region.objects.count(),
        PriceVersion.objects.count(),
        PriceEntry.objects.count(),
        NodePool.objects.count(),
        Image.objects.count(),
    )
    seed_catalog()
    assert counts == (
        GpuType.objects.count(),
        Region.objects.count(),
        PriceVersion.objects.count(),
        PriceEntry.objects.count(),
        NodePool.objects.count(),
        Image.objects.count(),
    )


def test_demo_image_references_are_valid_and_normalised(catalog):
    for image in Image.objects.for_tenant(None):
        assert str(parse_reference(image.reference)) == image.reference
