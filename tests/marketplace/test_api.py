"""The marketplace API: offers, estimates, images (tenant scoping and roles), catalog reads."""

from __future__ import annotations

import importlib
from decimal import Decimal

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.models import AuditEvent
from marketplace import services
from marketplace.api.serializers import OfferSerializer, offer_rows
from marketplace.demo import GPU_TYPES
from marketplace.models import GpuType, Image, NodePool, PriceEntry, Region, Tier
from marketplace.selectors import offers
from tests.conftest import token_client
from tests.marketplace.helpers import demo_image_slugs

D = Decimal
OFFERS = "/api/v1/offers"
ESTIMATES = "/api/v1/estimates"
IMAGES = "/api/v1/images"
OFFER_FIELDS = {
    "gpu_type",
    "region",
    "tier",
    "price_per_gpu_hour",
    "available_gpus",
    "memory_gib",
    "tflops",
    "price_per_pflop_hour",
}


@pytest.fixture
def api(catalog, world):
    return token_client(world.member, world.tenant)


def all_offers(api, **params):
    response = api.get(OFFERS, {"page_size": 500, **params})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == len(body["results"])
    return body["results"]


# --- offers ----


def test_offers_are_a_paginated_list_with_the_documented_fields(api):
    response = api.get(OFFERS)

    assert response.status_code == 200
    body = response.json()
    assert set(body) >= {"count", "next", "previous", "results"}
    assert body["count"] > len(body["results"]) == 50
    assert body["next"]
    for row in body["results"]:
        assert set(row) >= OFFER_FIELDS


def test_offer_rows_equal_the_serializer(api, world):
    everything = offers(tenant=world.tenant)
    assert any(o.is_cpu for o in everything) and any(not o.is_cpu for o in everything)
    expected = [dict(row) for row in OfferSerializer(everything, many=True).data]
    assert offer_rows(everything) == expected
    assert all_offers(api) == expected


def test_offer_filters_and_values(api):
    rows = all_offers(api, gpu_type="a100-80gb", region="us-west")

    by_tier = {row["tier"]: row for row in rows}
    assert set(by_tier) == set(Tier.values)
    on_demand = by_tier["on_demand"]
    assert on_demand["price_per_gpu_hour"] == "1.790000"
    assert by_tier["spot"]["price_per_gpu_hour"] == "0.805500"
    assert by_tier["reserved"]["price_per_gpu_hour"] == "1.521500"  # 1 month: 15 % off
    assert on_demand["memory_gib"] == 80
    assert D(on_demand["tflops"]) == D(312)
    assert on_demand["price_per_pflop_hour"] == "5.7372"  # 1.79 × 1000 / 312
    assert on_demand["available_gpus"] == 32  # demo: 4 nodes × 8
    # No reserved A100 pool in us-west: listed, but with nothing available.
    assert by_tier["reserved"]["available_gpus"] == 0

    assert [
        r["tier"] for r in all_offers(api, gpu_type="a100-80gb", region="us-west", tier="spot")
    ] == ["spot"]
    available = all_offers(api, gpu_type="a100-80gb", region="us-west", available="true")
    assert {r["tier"] for r in available} == {"on_demand", "spot"}
    for row in all_offers(api, available="true"):
        available = row["available_gpus"] if row["gpu_type"] else row["available_vcpus"]
        assert available > 0, row


def test_offer_filters_by_vendor_memory_and_cpu(api):
    amd = all_offers(api, vendor="amd")
    assert {r["gpu_type"] for r in amd} == {row[0] for row in GPU_TYPES if row[1] == "amd"}
    assert {r["gpu_type"] for r in amd} >= {"mi250", "mi300x"}
    big = all_offers(api, min_memory_gib=141)
    assert {r["gpu_type"] for r in big} == {row[0] for row in GPU_TYPES if row[3] >= 141}
    assert {r["gpu_type"] for r in big} >= {"h200-141gb", "mi300x"}
    cpu = [r for r in all_offers(api, region="us-east") if r["gpu_type"] is None]
    assert {r["tier"] for r in cpu} == set(Tier.values)
    assert all(r["price_per_gpu_hour"] is None and D(r["price_per_vcpu_hour"]) > 0 for r in cpu)
    assert not any(r["gpu_type"] is None for r in all_offers(api, include_cpu="false"))


def test_unavailable_offers_are_listed_with_zero_gpus(api):
    NodePool.objects.filter(gpu_type__slug="h200-141gb").update(in_use_gpus=16)

    listed = all_offers(api, gpu_type="h200-141gb")
    assert listed and all(r["available_gpus"] == 0 for r in listed)
    assert all_offers(api, gpu_type="h200-141gb", available="true") == []


@pytest.mark.parametrize(
    ("sort", "key", "descending"),
    [
        ("price", "price_per_gpu_hour", False),
        ("price_per_tflop", "price_per_pflop_hour", False),
        ("availability", "available_gpus", True),
    ],
)
def test_offer_sorts(api, sort, key, descending):
    rows = [r for r in all_offers(api, sort=sort) if r["gpu_type"] is not None]
    values = [D(str(r[key])) for r in rows]
    assert values == sorted(values, reverse=descending)
    assert len(set(values)) > 1
    only_gpu = all_offers(api, sort=sort, include_cpu="false")
    assert [D(str(r[key])) for r in only_gpu] == values


def test_offers_show_the_tenant_discount_to_that_tenant_only(api, world, other_world):
    services.tenant_pricing_set(
        tenant=world.tenant, discount_percent=D(10), note="", user=world.owner
    )
    other = token_client(other_world.member, other_world.tenant)

    ours = all_offers(api, gpu_type="a100-80gb", region="us-west", tier="on_demand")
    theirs = all_offers(other, gpu_type="a100-80gb", region="us-west", tier="on_demand")

    assert ours[0]["price_per_gpu_hour"] == "1.611000"
    assert theirs[0]["price_per_gpu_hour"] == "1.790000"


def test_offers_api_query_count_does_not_grow_with_the_catalog(
    api, catalog, django_assert_max_num_queries
):
    def count_queries():
        with CaptureQueriesContext(connection) as queries:
            assert api.get(OFFERS, {"page_size": 500}).status_code == 200
        return len(queries)

    count_queries()  # warm up: the first request of a token may write (e.g. last use)
    count_queries()  # and the next reads it again and keeps it (console.token_lookup)
    small = count_queries()
    region = Region.objects.create(slug="ap-south", name="AP South")
    for n in range(5):
        gpu = GpuType.objects.create(
            slug=f"extra-{n}",
            vendor="nvidia",
            model=f"Extra {n}",
            memory_gib=16,
            architecture="Test",
            peak_tflops=D(100),
            node_label_value=f"extra-{n}",
        )
        for r in Region.objects.all():
            PriceEntry.objects.create(
                version=catalog.version, gpu_type=gpu, region=r, on_demand_price=D(1)
            )
        NodePool.objects.create(
            slug=f"extra-{n}", name=f"extra {n}", region=region, backend="kubernetes", gpu_type=gpu
        )
    # The first read after a catalog change reloads the price book: a few queries more,
    # the same whatever the catalog's size; then it is kept again.
    assert count_queries() <= small + 3
    assert count_queries() == small
    with django_assert_max_num_queries(small):
        api.get(OFFERS, {"page_size": 500, "sort": "availability"})


# --- estimates ----


def test_estimate_api_returns_decimal_strings(api, catalog):
    response = api.post(
        ESTIMATES,
        {
            "gpu_type": "a100-80gb",
            "gpus_per_node": 8,
            "nodes": 10,
            "region": "us-west",
            "spot_ratio": "0.7",
            "hours": "24",
        },
        format="json",
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert {
        k: body[k] for k in ("hourly", "total", "currency", "spot_share", "on_demand_share")
    } == {
        "hourly": "88.07",
        "total": "2113.63",
        "currency": "USD",
        "spot_share": "1082.59",
        "on_demand_share": "1031.04",
    }
    assert (body["spot_nodes"], body["on_demand_nodes"]) == (7, 3)
    assert (body["split"], body["split_note"]) == ("7 spot + 3 on-demand nodes", "")
    assert body["price_version"] == catalog.version.pk


def test_estimate_api_answers_the_whole_node_split_it_priced(api):
    response = api.post(
        ESTIMATES,
        {
            "gpu_type": "a100-80gb",
            "gpus_per_node": 8,
            "nodes": 1,
            "region": "us-west",
            "spot_ratio": "0.7",
        },
        format="json",
    )
    body = response.json()
    # One node can't be 70 % spot: it is priced as the launch places it, on spot.
    assert (body["spot_nodes"], body["on_demand_nodes"], body["hourly"]) == (1, 0, "6.44")
    assert body["split"] == "1 node: spot"
    assert "can't be honoured with 1 node" in body["split_note"]


def test_estimate_api_for_cpu_and_reserved(api):
    cpu = api.post(
        ESTIMATES, {"nodes": 2, "cpus": 16, "region": "us-west", "hours": 10}, format="json"
    )
    assert cpu.status_code == 200, cpu.content
    assert (cpu.json()["hourly"], cpu.json()["total"]) == ("0.40", "4.00")

    reserved = api.post(
        ESTIMATES,
        {
            "gpu_type": "a100-80gb",
            "gpus_per_node": 8,
            "nodes": 1,
            "region": "us-west",
            "tier": "reserved",
            "reserved_months": 12,
            "hours": 24,
        },
        format="json",
    )
    assert reserved.status_code == 200, reserved.content
    assert (reserved.json()["hourly"], reserved.json()["total"]) == ("8.59", "206.21")


def test_estimate_api_applies_the_tenant_discount(api, world):
    services.tenant_pricing_set(
        tenant=world.tenant, discount_percent=D(10), note="", user=world.owner
    )
    response = api.post(
        ESTIMATES,
        {
            "gpu_type": "a100-80gb",
            "gpus_per_node": 8,
            "nodes": 10,
            "region": "us-west",
            "spot_ratio": "0.7",
        },
        format="json",
    )
    assert response.json()["hourly"] == "79.26"  # 88.068 × 0.9


GOOD = {"gpu_type": "a100-80gb", "gpus_per_node": 8, "nodes": 1, "region": "us-west"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"nodes": 0}, "nodes"),
        ({"nodes": -3}, "nodes"),
        ({"gpu_type": "b300-288gb"}, "gpu_type"),
        ({"spot_ratio": "1.5"}, "spot_ratio"),
        ({"spot_ratio": "-0.1"}, "spot_ratio"),
        ({"hours": "0"}, "hours"),
        ({"hours": "-5"}, "hours"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"gpu_type": None, "gpus_per_node": 0}, "cpus"),
        ({"region": "mars"}, "region"),
        ({"reserved_months": 6}, "reserved_months"),
    ],
)
def test_estimate_api_field_errors(api, overrides, field):
    response = api.post(ESTIMATES, {**GOOD, **overrides}, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()


def test_estimate_api_never_checks_capacity_or_quota(api, catalog, world):
    services.tenant_quota_set(
        tenant=world.tenant, gpu_type=None, max_gpus=0, max_concurrent_jobs=0, user=world.owner
    )
    NodePool.objects.update(in_use_gpus=1000)
    response = api.post(ESTIMATES, {**GOOD, "gpu_type": "mi250", "nodes": 512}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["hourly"] == "4874.24"


def test_estimate_api_needs_a_member(catalog, client):
    assert client.post(ESTIMATES, GOOD, content_type="application/json").status_code in (401, 403)


# --- images ----


def new_image(**overrides):
    return {
        "slug": "trainer",
        "name": "Trainer",
        "reference": "ghcr.io/acme/trainer:1.4.2",
        "kind": "framework",
        "compatible_with": ["nvidia"],
        **overrides,
    }


@pytest.mark.parametrize("role", ["owner", "admin"])
def test_tenant_admins_add_private_images(catalog, world, role):
    api = token_client(getattr(world, role), world.tenant)

    response = api.post(IMAGES, new_image(), format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["public"] is False
    assert body["reference"] == "ghcr.io/acme/trainer:1.4.2"
    assert Image.objects.get(pk=body["id"]).tenant == world.tenant
    assert AuditEvent.objects.filter(action="image.created", tenant=world.tenant).exists()


def test_private_image_from_a_registry_not_allowed_is_400_and_not_saved(catalog, world):
    api = token_client(world.admin, world.tenant)

    response = api.post(IMAGES, new_image(reference="quay.io/acme/trainer:1"), format="json")

    assert response.status_code == 400
    assert "reference" in response.json()
    assert not Image.objects.filter(tenant=world.tenant).exists()


@pytest.mark.parametrize("reference", ["ghcr.io/acme/trainer", "ghcr.io/acme/trainer:1;id"])
def test_invalid_reference_is_400(catalog, world, reference):
    api = token_client(world.admin, world.tenant)
    response = api.post(IMAGES, new_image(reference=reference), format="json")
    assert response.status_code == 400
    assert "reference" in response.json()


@pytest.mark.parametrize("role", ["member", "viewer", "finance"])
def test_others_cannot_add_or_retire_images(catalog, world, role):
    image = services.image_create(tenant=world.tenant, user=world.admin, **new_image())
    api = token_client(getattr(world, role), world.tenant)

    assert api.post(IMAGES, new_image(slug="mine"), format="json").status_code == 403
    assert api.delete(f"{IMAGES}/{image.pk}").status_code == 403
    assert Image.objects.filter(tenant=world.tenant).count() == 1
    image.refresh_from_db()
    assert image.is_active


def test_private_images_are_invisible_to_other_tenants(catalog, world, other_world):
    image = services.image_create(tenant=world.tenant, user=world.admin, **new_image())
    ours = token_client(world.member, world.tenant)
    theirs = token_client(other_world.admin, other_world.tenant)

    assert ours.get(f"{IMAGES}/{image.pk}").status_code == 200
    assert theirs.get(f"{IMAGES}/{image.pk}").status_code == 404
    assert theirs.delete(f"{IMAGES}/{image.pk}").status_code == 404
    their_ids = {r["id"] for r in theirs.get(IMAGES, {"page_size": 500}).json()["results"]}
    our_ids = {r["id"] for r in ours.get(IMAGES, {"page_size": 500}).json()["results"]}
    assert image.pk in our_ids
    assert image.pk not in their_ids
    assert our_ids - their_ids == {image.pk}
    image.refresh_from_db()
    assert image.is_active


def test_admin_retires_own_private_image_but_not_a_public_one(catalog, world):
    image = services.image_create(tenant=world.tenant, user=world.admin, **new_image())
    public = Image.objects.filter(tenant__isnull=True).first()
    api = token_client(world.admin, world.tenant)

    assert api.delete(f"{IMAGES}/{public.pk}").status_code == 404
    response = api.delete(f"{IMAGES}/{image.pk}")
    assert response.status_code == 200
    assert response.json()["is_active"] is False
    assert api.get(f"{IMAGES}/{image.pk}").status_code == 404
    public.refresh_from_db()
    assert public.is_active


def test_image_api_filters(api):
    def slugs(**params):
        body = api.get(IMAGES, {"page_size": 500, **params}).json()
        return {r["slug"] for r in body["results"]}

    assert slugs(kind="full_stack") == demo_image_slugs(kind="full_stack")
    assert {"ngc-pytorch-24-10", "hf-transformers-pytorch"} <= slugs(kind="full_stack")
    assert slugs(vendor="huawei") == demo_image_slugs(vendor="huawei")
    assert "mindspore-ascend-2-3" in slugs(vendor="huawei")
    assert slugs(q="tensorflow") == demo_image_slugs(query="tensorflow") == {"tensorflow-2-17-gpu"}
    assert slugs(q="pytorch", vendor="amd") == {"pytorch-rocm-6-2"}
    assert slugs() >= slugs(kind="base") | slugs(kind="framework")


def test_images_carry_what_they_serve_for_dev_environments(api, catalog, world):
    def slugs(**params):
        body = api.get(IMAGES, {"page_size": 500, **params}).json()
        return {r["slug"]: r["interactive"] for r in body["results"]}

    # The demo marks what its images' ports say: NGC runs Jupyter, HF Transformers both.
    assert slugs(interactive="jupyter") == {
        "ngc-pytorch-24-10": "jupyter",
        "hf-transformers-pytorch": "both",
    }
    assert slugs(interactive="ssh") == {"hf-transformers-pytorch": "both"}
    assert slugs()["python-3.11"] == ""
    bad = api.get(IMAGES, {"interactive": "vscode"})
    assert bad.status_code == 400 and "interactive" in bad.json()

    admin = token_client(world.admin, world.tenant)
    made = admin.post(IMAGES, new_image(interactive="ssh"), format="json")
    assert made.status_code == 201 and made.json()["interactive"] == "ssh"
    refused = admin.post(IMAGES, new_image(slug="other", interactive="vscode"), format="json")
    assert refused.status_code == 400 and "interactive" in refused.json()
    assert "trainer" in {
        r["slug"]
        for r in admin.get(IMAGES, {"interactive": "ssh", "page_size": 500}).json()["results"]
    }


def test_the_migration_marks_existing_images_by_their_ports(catalog, world):
    migration = importlib.import_module("marketplace.migrations.0013_image_interactive")
    both = services.image_create(
        tenant=world.tenant, user=world.admin,
        **new_image(ports=[{"name": "ssh", "port": 22}, {"name": "Jupyter", "port": 8888}]),
    )  # fmt: skip
    batch = services.image_create(
        tenant=world.tenant, user=world.admin, **new_image(slug="batch", ports=[])
    )
    Image.objects.update(interactive="")
    migration.mark_from_ports(apps, None)
    both.refresh_from_db()
    batch.refresh_from_db()
    assert (both.interactive, batch.interactive) == ("both", "")
    assert Image.objects.get(slug="ngc-pytorch-24-10").interactive == "jupyter"


# --- catalog reads ----


def test_catalog_reads(api, catalog):
    gpu_types = api.get("/api/v1/gpu-types", {"page_size": 500}).json()["results"]
    assert {g["slug"] for g in gpu_types} == {row[0] for row in GPU_TYPES}
    assert api.get("/api/v1/gpu-types/h100-80gb").json()["memory_gib"] == 80
    regions = {r["slug"] for r in api.get("/api/v1/regions").json()["results"]}
    assert {"us-west", "us-east", "eu-central"} <= regions
    pools = api.get("/api/v1/pools", {"page_size": 500}).json()["results"]
    assert pools and all("available_gpus" in p for p in pools)
    versions = api.get("/api/v1/price-versions").json()["results"]
    assert [v["id"] for v in versions] == [catalog.version.pk]
