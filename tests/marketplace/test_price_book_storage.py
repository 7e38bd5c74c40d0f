"""Volume storage prices in the staff price book: shown and edited per GiB-month (kept
per GiB-hour), in the preview of changes, and published with the new version."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal as D

from django.utils import timezone

from marketplace import services
from marketplace.models import PriceVersion, StoragePrice
from tests.conftest import signed_in_client
from tests.marketplace.test_price_book import STAFF_PRICES, in_force_discounts, page_form


def storage_cells(**per_month: str) -> dict[str, str]:
    return {f"storage|{slug.replace('_', '-')}": value for slug, value in per_month.items()}


def test_the_page_shows_storage_prices_per_gib_month(catalog, staff_user):
    html = signed_in_client(staff_user).get(STAFF_PRICES).content.decode()
    assert 'data-testid="storage-prices"' in html
    # The demo's 0.10 per GiB-month (× 1.10 in eu-central), as staff typed it.
    assert 'name="storage|us-west" value="0.1"' in html
    assert 'name="storage|eu-central" value="0.11"' in html


def test_the_preview_shows_storage_changes_and_publishing_keeps_them(catalog, staff_user):
    client = signed_in_client(staff_user)
    when = timezone.now() + timedelta(days=2)
    prices = {"cpu__us-west": "0.02"}
    storage = storage_cells(us_west="0.25", us_east="0.1", eu_central="0.11", local="")

    preview = client.post(STAFF_PRICES, {**page_form(when, "preview", **prices), **storage})
    assert preview.status_code == 200, preview.context["form"].errors
    rows = {r.region.slug: r for r in preview.context["preview"].storage_rows}
    assert set(rows) == {"us-west", "local"}  # us-east and eu-central keep their price
    assert (rows["us-west"].old_per_gib_month, rows["us-west"].new_per_gib_month) == (
        D("0.1"), D("0.25"),
    )  # fmt: skip
    assert rows["local"].new_price is None
    html = preview.content.decode()
    assert 'data-testid="storage-preview"' in html and "no price" in html
    assert PriceVersion.objects.count() == 1

    published = client.post(STAFF_PRICES, {**page_form(when, "publish", **prices), **storage})
    assert published.status_code == 302
    version = PriceVersion.objects.exclude(pk=catalog.version.pk).get()
    kept = {p.region.slug: p.price_per_gib_hour for p in version.storage_prices.all()}
    assert kept == {
        "us-west": services.storage_price_per_gib_hour(D("0.25")),
        "us-east": catalog.version.storage_prices.get(region__slug="us-east").price_per_gib_hour,
        "eu-central": catalog.version.storage_prices.get(
            region__slug="eu-central"
        ).price_per_gib_hour,
    }
    assert kept["us-west"] == D("0.000342466")


def test_a_bad_storage_price_is_a_form_error(catalog, staff_user):
    client = signed_in_client(staff_user)
    when = timezone.now() + timedelta(days=2)
    for value in ("abc", "-0.1", "NaN"):
        response = client.post(
            STAFF_PRICES,
            {
                **page_form(when, "publish", **{"cpu__us-west": "0.02"}),
                **storage_cells(us_west=value),
            },
        )
        assert response.status_code == 200
        assert "storage in us-west" in " ".join(response.context["form"].non_field_errors())
    assert PriceVersion.objects.count() == 1


def test_without_storage_cells_the_version_in_force_storage_prices_are_kept(catalog, staff_user):
    client = signed_in_client(staff_user)
    when = timezone.now() + timedelta(days=2)
    assert (
        client.post(
            STAFF_PRICES, page_form(when, "publish", **{"cpu__us-west": "0.02"})
        ).status_code
        == 302
    )
    version = PriceVersion.objects.exclude(pk=catalog.version.pk).get()
    assert (
        version.storage_prices.count()
        == StoragePrice.objects.filter(version=catalog.version).count()
    )


def test_the_service_preview_lists_only_storage_changes(catalog):
    version = catalog.version
    rows = [
        services.PriceRow(gpu_type=e.gpu_type, region=e.region, on_demand_price=e.on_demand_price)
        for e in version.entries.select_related("gpu_type", "region")
    ]
    storage = {p.region: p.price_per_gib_hour for p in version.storage_prices.all()}
    same = services.price_version_preview(rows=rows, storage_prices=storage, **in_force_discounts())
    assert not same.changes_anything
    region = catalog.region("us-east")
    storage[region] = D("0.001")
    changed = services.price_version_preview(
        rows=rows, storage_prices=storage, **in_force_discounts()
    )
    (row,) = changed.storage_rows
    assert (row.region, row.new_price, row.new_per_gib_month) == (region, D("0.001"), D("0.73"))
    assert changed.changes_anything and changed.rows == []
