"""Storage metering: provisioned GiB-hours into the ledger (tier "storage") from the
volume's creation until its deletion, priced by the region's storage price of the
price-book version in force; Cost Explorer lists the storage tier."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.invoices.services import invoice_draft_create
from billing.metering import meter_tick
from billing.metering.pieces import unit_hours_amount
from billing.metering.storage import STORAGE_TIER, storage_meter
from billing.models import UsageRecord
from marketplace.models import Region, StoragePrice
from marketplace.pricing import after_tenant_discount
from marketplace.services import tenant_pricing_set
from storage import services
from storage.models import Volume
from tests.conftest import token_client
from tests.factories import (
    PriceVersionFactory,
    RegionFactory,
    TenantFactory,
    UserFactory,
    VolumeFactory,
)
from tests.jobs_helpers import at_time
from tests.marketplace.test_price_book import publish

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)
prices = st.decimals(min_value=Decimal("0.000000001"), max_value=Decimal(1), places=9)


def storage_records(volume: Volume):
    return UsageRecord.objects.filter(tier=STORAGE_TIER, job_ref=volume.pk)


def billed(volume: Volume) -> Decimal:
    # Summed here, record by record: SQLite's SUM of a decimal column is a float.
    return sum((r.amount for r in storage_records(volume)), Decimal(0))


def priced_region(price: Decimal, *, since: datetime = START - timedelta(days=30)) -> Region:
    region = RegionFactory()
    StoragePrice.objects.create(
        version=PriceVersionFactory(effective_from=since), region=region, price_per_gib_hour=price
    )
    return region


@hypothesis_settings(
    deadline=None,
    max_examples=40,
    # Each example runs in its own savepoint, rolled back: nothing is shared between them.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    size=st.integers(1, 100_000),
    price=prices,
    ticks=st.lists(st.integers(1, 24 * 60), min_size=1, max_size=6),
)
def test_metered_amount_is_size_times_hours_times_price_exactly(db, size, price, ticks):
    with transaction.atomic():
        _meter_and_check(size, price, ticks)
        transaction.set_rollback(True)


def _meter_and_check(size: int, price: Decimal, ticks: list[int]) -> None:
    region = priced_region(price)
    volume = VolumeFactory(tenant=TenantFactory(), size_gib=size, region=region, created_at=START)
    # Ticks at any whole hours, in any order, some repeated: each hour is billed once.
    for hours in ticks:
        storage_meter(now=START + hours * HOUR)
    metered_hours = max(ticks)
    assert billed(volume) == size * metered_hours * price
    records = list(storage_records(volume).order_by("interval_start"))
    assert records[0].interval_start == START
    assert all(a.interval_end == b.interval_start for a, b in pairwise(records))
    assert records[-1].interval_end == START + metered_hours * HOUR


@hypothesis_settings(deadline=None, max_examples=40)
@given(size=st.integers(1, 10_000), seconds=st.integers(1, 10**7), price=prices)
def test_the_amount_of_any_duration_is_rounded_once(size, seconds, price):
    exact = Decimal(size) * Decimal(seconds) / 3600 * price
    assert abs(unit_hours_amount(units=size, seconds=Decimal(seconds), price_per_unit_hour=price)
               - exact) <= Decimal("0.0000000005")  # fmt: skip


def test_deleting_stops_the_meter_and_a_resize_bills_the_old_size_first(world):
    price = Decimal("0.0001")  # per GiB-hour: 0.073 per GiB-month
    region = priced_region(price)
    with at_time(START):
        volume = services.volume_create(
            tenant=world.tenant, user=world.member, name="data", size_gib=10, region=region.slug
        )
    with at_time(START + 2 * HOUR):
        services.volume_resize(volume=volume, user=world.member, size_gib=30)
    with at_time(START + 3 * HOUR):
        services.volume_delete(volume=volume, user=world.member)
    storage_meter(now=START + 10 * HOUR)
    storage_meter(now=START + 11 * HOUR)
    assert billed(volume) == 10 * 2 * price + 30 * 1 * price
    assert storage_records(volume).latest("interval_end").interval_end == START + 3 * HOUR
    assert {r.units for r in storage_records(volume)} == {10, 30}


def test_a_region_without_a_storage_price_is_billed_zero_with_a_note(world):
    volume = VolumeFactory(tenant=world.tenant, region=RegionFactory(), created_at=START)
    PriceVersionFactory(effective_from=START - timedelta(days=1))
    storage_meter(now=START + HOUR)
    (record,) = storage_records(volume)
    assert record.amount == 0 and "no storage price" in record.note


def test_a_new_price_version_cuts_the_piece(world):
    region = priced_region(Decimal("0.001"))
    later = PriceVersionFactory(effective_from=START + timedelta(minutes=30))
    StoragePrice.objects.create(version=later, region=region, price_per_gib_hour=Decimal("0.002"))
    volume = VolumeFactory(tenant=world.tenant, size_gib=4, region=region, created_at=START)
    storage_meter(now=START + HOUR)
    assert billed(volume) == 4 * Decimal("0.5") * Decimal("0.001") + 4 * Decimal("0.5") * Decimal(
        "0.002"
    )


def test_cost_explorer_lists_storage_as_a_tier(world, other_world):
    region = priced_region(Decimal("0.01"))
    VolumeFactory(tenant=world.tenant, size_gib=100, region=region, created_at=START)
    VolumeFactory(tenant=other_world.tenant, size_gib=5, region=region, created_at=START)
    meter_tick(now=START + 5 * HOUR)
    api = token_client(world.viewer, world.tenant)
    body = api.get(
        "/api/v1/usage", {"start": "2026-03-02", "end": "2026-03-02", "group_by": "tier"}
    ).json()
    assert [(r["key"], Decimal(r["amount"])) for r in body["results"]] == [
        ("storage", Decimal(100 * 5) * Decimal("0.01"))
    ]
    by_type = api.get(
        "/api/v1/usage", {"start": "2026-03-02", "end": "2026-03-02", "group_by": "gpu_type"}
    ).json()
    assert [r["key"] for r in by_type["results"]] == ["storage"]


def test_a_new_price_version_keeps_the_storage_prices_unless_given(catalog):
    staff = UserFactory(is_staff=True)
    local = Region.objects.get(slug="local")
    in_force = StoragePrice.objects.get(region=local).price_per_gib_hour
    kept = publish(catalog, staff, effective_from=timezone.now() + HOUR)
    assert kept.storage_prices.get(region=local).price_per_gib_hour == in_force
    given = publish(
        catalog,
        staff,
        effective_from=timezone.now() + 2 * HOUR,
        storage_prices={local: Decimal("0.0002")},
    )
    assert [(p.region, p.price_per_gib_hour) for p in given.storage_prices.all()] == [
        (local, Decimal("0.0002"))
    ]


def test_the_invoice_has_a_storage_line_in_gib_hours(world):
    region = priced_region(Decimal("0.0002"))
    VolumeFactory(tenant=world.tenant, name="data", size_gib=50, region=region, created_at=START)
    storage_meter(now=START + 10 * HOUR)
    invoice = invoice_draft_create(
        tenant=world.tenant,
        period_start=datetime(2026, 3, 1, tzinfo=UTC),
        period_end=datetime(2026, 4, 1, tzinfo=UTC),
    )
    (line,) = invoice.lines.all()
    assert line.description == f"Volume storage · {region.slug}"
    assert (line.quantity, line.unit, line.tier) == (Decimal(500), "GiB-hour", STORAGE_TIER)
    assert line.amount == Decimal("0.1")


def test_the_tenant_discount_applies_to_storage_as_to_compute(world, other_world):
    """20 % off: 50 GiB × 10 h × 0.0002 = 0.1 at list price, 0.08 charged, the line
    showing the 0.02 the discount took off; another tenant pays list price."""
    tenant_pricing_set(
        tenant=world.tenant, discount_percent=Decimal(20), note="contract", user=UserFactory()
    )
    region = priced_region(Decimal("0.0002"))
    ours = VolumeFactory(tenant=world.tenant, size_gib=50, region=region, created_at=START)
    theirs = VolumeFactory(tenant=other_world.tenant, size_gib=50, region=region, created_at=START)
    storage_meter(now=START + 10 * HOUR)
    assert billed(ours) == Decimal("0.08") and billed(theirs) == Decimal("0.1")
    record = storage_records(ours).first()
    assert record.discount_percent == Decimal(20)
    assert record.unit_price == after_tenant_discount(Decimal("0.0002"), Decimal(20))
    assert record.on_demand_amount == record.amount
    invoice = invoice_draft_create(
        tenant=world.tenant,
        period_start=datetime(2026, 3, 1, tzinfo=UTC),
        period_end=datetime(2026, 4, 1, tzinfo=UTC),
    )
    (line,) = invoice.lines.all()
    assert (line.amount, line.unit, line.quantity) == (Decimal("0.08"), "GiB-hour", Decimal(500))
    assert invoice.discount == Decimal("0.02")


@hypothesis_settings(
    deadline=None,
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    size=st.integers(1, 10_000),
    price=prices,
    percent=st.decimals(min_value=0, max_value=Decimal("99.99"), places=2),
    hours=st.integers(1, 48),
)
def test_a_discounted_storage_amount_is_exact(db, size, price, percent, hours):
    with transaction.atomic():
        tenant = TenantFactory()
        tenant_pricing_set(tenant=tenant, discount_percent=percent, note="", user=UserFactory())
        volume = VolumeFactory(
            tenant=tenant, size_gib=size, region=priced_region(price), created_at=START
        )
        storage_meter(now=START + hours * HOUR)
        # One record per hour (START is on the hour), each rounded once.
        expected = hours * unit_hours_amount(
            units=size,
            seconds=Decimal(3600),
            price_per_unit_hour=after_tenant_discount(price, percent),
        )
        assert sum(r.amount for r in storage_records(volume)) == expected
        transaction.set_rollback(True)
