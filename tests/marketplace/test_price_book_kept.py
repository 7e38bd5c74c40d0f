"""Offers read the price book from memory while the catalog's revision is unchanged
(marketplace.price_book_cache): a catalog change in this process or in another one, and the next
version taking effect, are seen on the next read."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from marketplace.models import CatalogRevision, GpuType, PriceEntry
from marketplace.price_book_cache import catalog_names, catalog_revision, price_book
from marketplace.selectors import offers
from tests.factories import GpuTypeFactory
from tests.marketplace.test_price_book import publish

D = Decimal
A100 = ("a100-80gb", "us-west", "on_demand")


def a100_offer(tenant):
    return next(
        offer
        for offer in offers(tenant=tenant)
        if (offer.gpu_label, offer.region.slug, offer.tier) == A100
    )


def price_book_tables_read(tenant) -> set[str]:
    with CaptureQueriesContext(connection) as queries:
        offers(tenant=tenant)
    sql = " ".join(query["sql"] for query in queries)
    return {table for table in ("priceentry", "priceversion", "gputype") if table in sql}


def test_offers_read_the_price_book_once_while_the_catalog_is_unchanged(catalog, world):
    offers(tenant=world.tenant)
    assert price_book_tables_read(world.tenant) == set()
    assert a100_offer(world.tenant).unit_price == D("1.79")


def test_a_version_published_here_is_offered_at_once(catalog, world, staff_user):
    assert a100_offer(world.tenant).unit_price == D("1.79")
    now = timezone.now()
    publish(catalog, staff_user, effective_from=now, now=now, a100_us_west=D("2.50"))
    assert a100_offer(world.tenant).unit_price == D("2.50")


def test_a_change_another_process_committed_is_seen_through_the_revision(catalog, world):
    """Another process's change arrives as rows plus a new revision token, with no signal in
    this process: written here as plain updates."""
    assert a100_offer(world.tenant).unit_price == D("1.79")
    PriceEntry.objects.filter(
        version=catalog.version, gpu_type=catalog.gpu("a100-80gb"), region__slug="us-west"
    ).update(on_demand_price=D("3.10"))
    assert a100_offer(world.tenant).unit_price == D("1.79")  # kept: the revision is the same
    CatalogRevision.objects.filter(pk=1).update(token="changed-elsewhere")
    assert a100_offer(world.tenant).unit_price == D("3.10")


def test_a_gpu_type_retired_by_staff_leaves_the_offers(catalog, world):
    assert a100_offer(world.tenant)
    gpu = GpuType.objects.get(slug="a100-80gb")
    gpu.is_active = False
    gpu.save()
    assert all(offer.gpu_label != "a100-80gb" for offer in offers(tenant=world.tenant))


def test_the_next_version_is_offered_from_its_effective_time(
    catalog, world, staff_user, monkeypatch
):
    switch = timezone.now() + timedelta(hours=1)
    publish(catalog, staff_user, effective_from=switch, a100_us_west=D("2.50"))
    before = a100_offer(world.tenant)
    assert (before.unit_price, before.next_unit_price) == (D("1.79"), D("2.50"))
    assert before.next_price_from == switch
    monkeypatch.setattr(timezone, "now", lambda: switch)
    after = a100_offer(world.tenant)
    assert (after.unit_price, after.next_unit_price) == (D("2.50"), None)


def test_an_explicit_time_reads_the_database_and_keeps_nothing(catalog, world, staff_user):
    switch = timezone.now() + timedelta(days=2)
    publish(catalog, staff_user, effective_from=switch, a100_us_west=D("2.50"))
    kept = price_book()
    later = price_book(at=switch + timedelta(minutes=1))
    assert later is not None and kept is not None
    assert kept.version == catalog.version and later.version.effective_from == switch
    assert price_book() is kept


@pytest.mark.django_db(transaction=True)
def test_without_a_revision_row_nothing_is_kept(catalog, world):
    CatalogRevision.objects.all().delete()
    assert catalog_revision() is None
    first, second = price_book(), price_book()
    assert first is not None and second is not None and first is not second
    GpuType.objects.filter(slug="a100-80gb").update(memory_gib=81)
    gpu = GpuType.objects.get(slug="a100-80gb")
    gpu.save()  # a catalog change writes the row again
    assert catalog_revision() is not None
    assert price_book() is price_book()


def test_job_lists_read_catalog_names_once_and_see_a_rename_and_a_row_made_without_signals(
    catalog, world
):
    h100 = catalog.gpu("h100-80gb")
    names = catalog_names(gpu_type_ids=[h100.pk])
    assert names.gpu_types[h100.pk] == ("h100-80gb", h100.model)
    assert names.regions[catalog.region("us-west").pk][0] == "us-west"
    with CaptureQueriesContext(connection) as queries:
        assert catalog_names(gpu_type_ids=[h100.pk, None]) is names  # kept
    assert [q["sql"] for q in queries if "gputype" in q["sql"]] == []
    # A rename through the ORM is a new revision: seen on the next read.
    h100.model = "H100 80GB (renamed)"
    h100.save()
    assert catalog_names().gpu_types[h100.pk][1] == "H100 80GB (renamed)"
    # A row written without signals (bulk_create) is read as soon as it is asked for.
    (made,) = GpuType.objects.bulk_create([GpuTypeFactory.build(slug="x1", model="X1")])
    assert catalog_names(gpu_type_ids=[made.pk]).gpu_types[made.pk] == ("x1", "X1")
