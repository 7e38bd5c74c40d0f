"""The dated price book: publishing (service, staff page, staff API), withdrawal, and
"earlier usage keeps its old price"."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from console.models import AuditEvent
from console.service_errors import ServiceError
from marketplace import services
from marketplace.models import NodePool, PriceVersion
from marketplace.pricing import estimate_cost, price_entry_in_force
from tests.conftest import signed_in_client, token_client

D = Decimal
RESERVED = {1: D(15), 3: D(25), 12: D(40)}
STAFF_PRICES = reverse("marketplace:staff_prices")
PRICE_VERSIONS_API = "/api/v1/price-versions"


def publish(catalog, user, *, effective_from, a100_us_west=D("2.00"), **kwargs):
    rows = [
        services.PriceRow(
            gpu_type=catalog.gpu("a100-80gb"),
            region=catalog.region("us-west"),
            on_demand_price=a100_us_west,
        ),
        services.PriceRow(
            gpu_type=None, region=catalog.region("us-west"), on_demand_price=D("0.02")
        ),
    ]
    return services.price_version_publish(
        effective_from=effective_from,
        rows=rows,
        spot_discount_percent=kwargs.pop("spot", D(50)),
        reserved_discount_percent=kwargs.pop("reserved", RESERVED),
        user=user,
        **kwargs,
    )


def a100_hourly(catalog, at):
    return estimate_cost(
        gpu_type=catalog.gpu("a100-80gb"),
        region=catalog.region("us-west"),
        nodes=1,
        gpus_per_node=1,
        at=at,
    ).hourly


# --- service ----


def test_publishing_in_the_past_is_refused_and_saves_nothing(catalog, staff_user):
    with pytest.raises(ServiceError) as raised:
        publish(catalog, staff_user, effective_from=timezone.now() - timedelta(minutes=5))

    assert raised.value.field == "effective_from"
    assert PriceVersion.objects.count() == 1
    assert not AuditEvent.objects.filter(action="price_version.published").exists()


def test_publish_is_audited(catalog, staff_user):
    when = timezone.now() + timedelta(days=1)
    version = publish(catalog, staff_user, effective_from=when, note="Q3")

    event = AuditEvent.objects.get(action="price_version.published")
    assert event.actor == staff_user
    assert event.target_id == str(version.pk)
    assert event.metadata["entries"] == 2
    assert version.entries.count() == 2
    assert version.created_by == staff_user


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"spot": D(100)}, "spot_discount_percent"),
        ({"spot": D(-1)}, "spot_discount_percent"),
        ({"reserved": {1: D(15), 3: D(100), 12: D(40)}}, "reserved_3m_discount_percent"),
        ({"currency": "US"}, "currency"),
        ({"currency": "U$D"}, "currency"),
        ({"a100_us_west": D(0)}, "prices"),
    ],
)
def test_publish_validates(catalog, staff_user, kwargs, field):
    with pytest.raises(ServiceError) as raised:
        publish(catalog, staff_user, effective_from=timezone.now() + timedelta(hours=1), **kwargs)
    assert raised.value.field == field
    assert PriceVersion.objects.count() == 1


def test_publish_refuses_a_price_given_twice(catalog, staff_user):
    row = services.PriceRow(
        gpu_type=None, region=catalog.region("us-west"), on_demand_price=D("0.02")
    )
    with pytest.raises(ServiceError) as raised:
        services.price_version_publish(
            effective_from=timezone.now() + timedelta(hours=1),
            rows=[row, row],
            spot_discount_percent=D(50),
            reserved_discount_percent=RESERVED,
            user=staff_user,
        )
    assert raised.value.field == "prices"


def test_earlier_usage_keeps_its_old_price(catalog, staff_user):
    before = timezone.now()
    switch = before + timedelta(days=7)
    new = publish(catalog, staff_user, effective_from=switch, a100_us_west=D("2.50"))

    old_version, old_entry = price_entry_in_force(
        gpu_type=catalog.gpu("a100-80gb"), region=catalog.region("us-west"), at=before
    )
    new_version, new_entry = price_entry_in_force(
        gpu_type=catalog.gpu("a100-80gb"), region=catalog.region("us-west"), at=switch
    )
    assert (old_version, old_entry.on_demand_price) == (catalog.version, D("1.79"))
    assert (new_version, new_entry.on_demand_price) == (new, D("2.50"))
    assert a100_hourly(catalog, before) == D("1.79")
    assert a100_hourly(catalog, switch - timedelta(microseconds=1)) == D("1.79")
    assert a100_hourly(catalog, switch) == D("2.50")
    assert a100_hourly(catalog, switch + timedelta(days=365)) == D("2.50")
    assert PriceVersion.objects.in_force(before) == catalog.version
    assert PriceVersion.objects.in_force(switch) == new


def test_a_version_effective_now_applies_at_once_but_not_to_the_past(catalog, staff_user):
    earlier = timezone.now() - timedelta(hours=1)
    now = timezone.now()
    publish(catalog, staff_user, effective_from=now, now=now, a100_us_west=D("2.50"))

    assert a100_hourly(catalog, earlier) == D("1.79")
    assert a100_hourly(catalog, None) == D("2.50")


def test_a_scheduled_version_can_be_withdrawn(catalog, staff_user):
    version = publish(catalog, staff_user, effective_from=timezone.now() + timedelta(days=1))

    services.price_version_withdraw(version=version, user=staff_user)

    assert not PriceVersion.objects.filter(pk=version.pk).exists()
    assert AuditEvent.objects.filter(action="price_version.withdrawn").exists()
    assert a100_hourly(catalog, timezone.now() + timedelta(days=2)) == D("1.79")


def test_a_version_in_force_cannot_be_withdrawn(catalog, staff_user):
    with pytest.raises(ServiceError) as raised:
        services.price_version_withdraw(version=catalog.version, user=staff_user)

    assert raised.value.code == "conflict"
    assert PriceVersion.objects.filter(pk=catalog.version.pk).exists()


def in_force_discounts():
    version = PriceVersion.objects.in_force()
    return {
        "spot_discount_percent": version.spot_discount_percent,
        "reserved_discount_percent": {m: version.reserved_discount(m) for m in (1, 3, 12)},
    }


def test_preview_shows_only_what_changes_and_saves_nothing(catalog):
    version = catalog.version
    unchanged = [
        services.PriceRow(gpu_type=e.gpu_type, region=e.region, on_demand_price=e.on_demand_price)
        for e in version.entries.select_related("gpu_type", "region")
    ]
    a100 = (catalog.gpu("a100-80gb"), catalog.region("us-west"))
    rows = [r for r in unchanged if (r.gpu_type, r.region) != a100]
    rows.append(services.PriceRow(gpu_type=a100[0], region=a100[1], on_demand_price=D("1.969")))

    preview = services.price_version_preview(rows=rows, **in_force_discounts())

    (row,) = preview.rows
    assert (row.old_price, row.new_price, row.change_percent) == (D("1.79"), D("1.969"), D("10.0"))
    assert preview.discounts == []
    assert preview.unchanged == len(unchanged) - 1
    assert PriceVersion.objects.count() == 1


def test_preview_shows_a_discount_change_and_a_withdrawn_offer(catalog):
    version = catalog.version
    rows = [
        services.PriceRow(gpu_type=e.gpu_type, region=e.region, on_demand_price=e.on_demand_price)
        for e in version.entries.select_related("gpu_type", "region")
    ]
    withdrawn = rows.pop()
    discounts = in_force_discounts()
    discounts["spot_discount_percent"] = version.spot_discount_percent + 5

    preview = services.price_version_preview(rows=rows, **discounts)

    (row,) = preview.rows
    assert (row.gpu_type, row.region, row.new_price) == (withdrawn.gpu_type, withdrawn.region, None)
    (change,) = preview.discounts
    assert change.label == "Spot discount"
    assert change.new_percent - change.old_percent == 5
    assert preview.unchanged == len(rows)


# --- staff page ----


def page_form(effective_from, action, **cells):
    data = {
        "effective": "at",
        "effective_from": effective_from.strftime("%Y-%m-%dT%H:%M"),
        "currency": "USD",
        "spot_discount_percent": "50",
        "reserved_1m_discount_percent": "15",
        "reserved_3m_discount_percent": "25",
        "reserved_12m_discount_percent": "40",
        "note": "page",
        "action": action,
    }
    data.update({f"price|{key.replace('__', '|')}": value for key, value in cells.items()})
    return data


def test_staff_page_previews_then_publishes(catalog, staff_user):
    client = signed_in_client(staff_user)
    when = timezone.now() + timedelta(days=3)
    cells = {"a100-80gb__us-west": "1.969", "cpu__us-west": "0.02"}

    shown = client.get(STAFF_PRICES)
    assert shown.status_code == 200
    assert 'name="price|a100-80gb|us-west" value="1.790000"' in shown.content.decode()

    preview = client.post(STAFF_PRICES, page_form(when, "preview", **cells))
    assert preview.status_code == 200
    html = preview.content.decode()
    assert 'data-testid="price-preview"' in html
    assert "10.0 %" in html
    assert 'value="publish"' in html
    assert PriceVersion.objects.count() == 1
    assert not AuditEvent.objects.filter(action="price_version.published").exists()

    published = client.post(STAFF_PRICES, page_form(when, "publish", **cells))
    assert published.status_code == 302
    version = PriceVersion.objects.exclude(pk=catalog.version.pk).get()
    assert version.entries.count() == 2
    assert version.spot_discount_percent == D(50)
    event = AuditEvent.objects.get(action="price_version.published")
    assert event.actor == staff_user


def test_staff_page_refuses_a_past_effective_time(catalog, staff_user):
    client = signed_in_client(staff_user)
    past = timezone.now() - timedelta(days=1)

    response = client.post(STAFF_PRICES, page_form(past, "publish", **{"cpu__us-west": "0.02"}))

    assert response.status_code == 200
    assert response.context["form"].errors.get("effective_from")
    assert PriceVersion.objects.count() == 1


def test_staff_page_publishes_a_version_effective_now(catalog, staff_user):
    client = signed_in_client(staff_user)
    now = timezone.now()  # the datetime-local input has minute precision: this minute

    response = client.post(STAFF_PRICES, page_form(now, "publish", **{"cpu__us-west": "0.02"}))

    assert response.status_code == 302, response.context["form"].errors
    version = PriceVersion.objects.exclude(pk=catalog.version.pk).get()
    assert version.effective_from <= timezone.now()
    assert PriceVersion.objects.in_force() == version


def test_staff_page_refuses_a_non_numeric_price(catalog, staff_user):
    client = signed_in_client(staff_user)
    when = timezone.now() + timedelta(days=1)

    response = client.post(STAFF_PRICES, page_form(when, "publish", **{"cpu__us-west": "abc"}))

    assert response.status_code == 200
    assert response.context["form"].non_field_errors()
    assert PriceVersion.objects.count() == 1


def test_staff_can_withdraw_a_scheduled_version_from_its_page(catalog, staff_user):
    version = publish(catalog, staff_user, effective_from=timezone.now() + timedelta(days=1))
    client = signed_in_client(staff_user)
    url = reverse("marketplace:staff_price_version", args=[version.pk])

    assert client.get(url).status_code == 200
    assert client.post(url).status_code == 302
    assert not PriceVersion.objects.filter(pk=version.pk).exists()

    in_force = reverse("marketplace:staff_price_version", args=[catalog.version.pk])
    assert client.post(in_force).status_code == 302
    assert PriceVersion.objects.filter(pk=catalog.version.pk).exists()


STAFF_PAGES = [
    ("marketplace:staff_prices", []),
    ("marketplace:staff_catalog", []),
    ("marketplace:staff_gpu_type_edit", ["h100-80gb"]),
    ("marketplace:staff_registry_add", []),
]


@pytest.mark.parametrize("role", ["owner", "admin", "member", "viewer", "finance"])
def test_staff_pages_are_404_for_non_staff(catalog, world, role):
    client = signed_in_client(getattr(world, role), world.tenant)
    pool = NodePool.objects.first()
    urls = [reverse(name, args=args) for name, args in STAFF_PAGES] + [
        reverse("marketplace:staff_price_version", args=[catalog.version.pk]),
        reverse("marketplace:staff_pool_edit", args=[pool.pk]),
        reverse("marketplace:staff_tenant_commercials", args=[world.tenant.slug]),
    ]
    for url in urls:
        assert client.get(url).status_code == 404, url
        assert client.post(url, {}).status_code == 404, url
    when = timezone.now() + timedelta(days=1)
    client.post(STAFF_PRICES, page_form(when, "publish", **{"cpu__us-west": "0.02"}))
    assert PriceVersion.objects.count() == 1


def test_staff_pages_render_for_staff(catalog, staff_user, world):
    client = signed_in_client(staff_user)
    pool = NodePool.objects.first()
    for url in [
        reverse("marketplace:staff_catalog"),
        reverse("marketplace:staff_gpu_type_edit", args=["h100-80gb"]),
        reverse("marketplace:staff_pool_edit", args=[pool.pk]),
        reverse("marketplace:staff_tenant_commercials", args=[world.tenant.slug]),
        reverse("marketplace:staff_price_version", args=[catalog.version.pk]),
    ]:
        assert client.get(url).status_code == 200, url


# --- staff API ----


def api_body(effective_from, **overrides):
    body = {
        "effective_from": effective_from.isoformat(),
        "spot_discount_percent": "50",
        "reserved_1m_discount_percent": "15",
        "reserved_3m_discount_percent": "25",
        "reserved_12m_discount_percent": "40",
        "note": "api",
        "entries": [
            {"gpu_type": "a100-80gb", "region": "us-west", "on_demand_price": "2.10"},
            {"gpu_type": None, "region": "us-west", "on_demand_price": "0.02"},
        ],
    }
    body.update(overrides)
    return body


def test_staff_publish_through_the_api(catalog, staff_user, world):
    api = token_client(staff_user, world.tenant)
    when = timezone.now() + timedelta(days=2)

    response = api.post(PRICE_VERSIONS_API, api_body(when), format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert {e["gpu_type"] for e in body["entries"]} == {"a100-80gb", None}
    assert AuditEvent.objects.filter(action="price_version.published").count() == 1
    assert a100_hourly(catalog, when) == D("2.10")
    assert a100_hourly(catalog, timezone.now()) == D("1.79")
    listing = token_client(world.member, world.tenant).get(PRICE_VERSIONS_API)
    assert listing.status_code == 200
    assert listing.json()["count"] == 2


def test_api_refuses_a_past_effective_time_with_a_field_error(catalog, staff_user, world):
    api = token_client(staff_user, world.tenant)
    past = timezone.now() - timedelta(hours=1)

    response = api.post(PRICE_VERSIONS_API, api_body(past), format="json")

    assert response.status_code == 400
    assert "effective_from" in response.json()
    assert PriceVersion.objects.count() == 1
    assert not AuditEvent.objects.filter(action="price_version.published").exists()


@pytest.mark.parametrize("role", ["owner", "admin", "member"])
def test_staff_api_writes_are_403_for_non_staff(catalog, world, role):
    api = token_client(getattr(world, role), world.tenant)
    pool = NodePool.objects.first()

    published = api.post(
        PRICE_VERSIONS_API, api_body(timezone.now() + timedelta(days=1)), format="json"
    )
    patched = api.patch(f"/api/v1/staff/pools/{pool.pk}", {"name": "mine"}, format="json")
    listed = api.get("/api/v1/staff/pools")

    # The staff pool endpoints hide themselves (404), like every staff-only endpoint.
    for response, status in ((published, 403), (patched, 404), (listed, 404)):
        assert response.status_code == status
        assert response["Content-Type"].startswith("application/json")
        assert "detail" in response.json()
    assert PriceVersion.objects.count() == 1
    pool.refresh_from_db()
    assert pool.name != "mine"


def test_staff_patches_a_pool_but_not_its_capacity(catalog, staff_user, world):
    api = token_client(staff_user, world.tenant)
    pool = NodePool.objects.filter(gpu_type__isnull=False).first()
    total = pool.total_gpus

    response = api.patch(
        f"/api/v1/staff/pools/{pool.pk}",
        {"name": "Renamed", "total_gpus": total + 100, "is_active": False},
        format="json",
    )

    assert response.status_code == 200, response.content
    pool.refresh_from_db()
    assert (pool.name, pool.total_gpus, pool.is_active) == ("Renamed", total, False)
    assert AuditEvent.objects.filter(action="node_pool.changed").exists()


def test_staff_set_a_pools_preemption_knobs_through_the_api(catalog, staff_user, world):
    api = token_client(staff_user, world.tenant)
    pool = NodePool.objects.filter(gpu_type__isnull=False).first()
    url = f"/api/v1/staff/pools/{pool.pk}"

    # Decimals travel as strings (the schema's); a JSON number is refused, not rounded.
    assert api.patch(url, {"preemption_threshold": 0.5}, format="json").status_code == 400
    refused = api.patch(url, {"preemption_threshold": "1.5"}, format="json")
    assert refused.status_code == 400
    assert "preemption_threshold" in json.dumps(refused.json())
    saved = api.patch(
        url, {"preemption_threshold": "0.5", "preempt_other_tenants_spot": True}, format="json"
    )
    assert saved.status_code == 200, saved.content
    assert saved.json()["preemption_threshold"] == "0.50"
    pool.refresh_from_db()
    assert (pool.preemption_threshold, pool.preempt_other_tenants_spot) == (Decimal("0.5"), True)
    refused = api.patch(url, {"memory_margin": "1.5"}, format="json")
    assert refused.status_code == 400 and "memory_margin" in refused.json()
    saved = api.patch(url, {"memory_margin": "0.1"}, format="json")
    assert saved.status_code == 200 and saved.json()["memory_margin"] == "0.10"
    pool.refresh_from_db()
    assert pool.memory_margin == Decimal("0.1")
    refused = api.patch(url, {"runtime_class_name": "gVisor!"}, format="json")
    assert refused.status_code == 400 and "runtime_class_name" in json.dumps(refused.json())
    saved = api.patch(url, {"runtime_class_name": "gvisor"}, format="json")
    assert saved.status_code == 200 and saved.json()["runtime_class_name"] == "gvisor"
    assert api.patch(url, {"runtime_class_name": ""}, format="json").status_code == 200


def test_staff_page_publishes_effective_now_without_a_time(catalog, staff_user):
    client = signed_in_client(staff_user)
    data = page_form(timezone.now(), "publish", **{"cpu__us-west": "0.02"})
    data["effective"], data["effective_from"] = "now", ""

    response = client.post(STAFF_PRICES, data)

    assert response.status_code == 302, response.context["form"].errors
    version = PriceVersion.objects.exclude(pk=catalog.version.pk).get()
    assert PriceVersion.objects.in_force() == version


def test_staff_page_asks_for_the_time_of_a_later_version(catalog, staff_user):
    data = page_form(timezone.now(), "preview", **{"cpu__us-west": "0.02"})
    data["effective_from"] = ""

    response = signed_in_client(staff_user).post(STAFF_PRICES, data)

    assert response.status_code == 200
    assert response.context["form"].errors["effective_from"] == [
        "Give the time it takes effect, or choose Now."
    ]


def test_staff_page_preview_lists_the_discount_change_only(catalog, staff_user):
    version = catalog.version
    cells = {
        f"{e.gpu_type.slug if e.gpu_type else 'cpu'}__{e.region.slug}": str(e.on_demand_price)
        for e in version.entries.select_related("gpu_type", "region")
    }
    data = page_form(timezone.now() + timedelta(days=1), "preview", **cells)
    data.update(
        {
            "spot_discount_percent": str(version.spot_discount_percent + 5),
            "reserved_1m_discount_percent": str(version.reserved_1m_discount_percent),
            "reserved_3m_discount_percent": str(version.reserved_3m_discount_percent),
            "reserved_12m_discount_percent": str(version.reserved_12m_discount_percent),
        }
    )

    html = signed_in_client(staff_user).post(STAFF_PRICES, data).content.decode()

    assert "Spot discount" in html
    assert "On-demand prices that change" not in html
    assert f"{len(cells)} offers keep their price" in html
    assert " in 4" not in html  # price cells are labelled by region, not a column number
