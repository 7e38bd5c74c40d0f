"""Staff catalog services: GPU type and pool edits, the registry allow-list; and the
launch form's default region. Each write is audited with the row it changed."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.urls import reverse

from console.models import AuditEvent
from console.service_errors import ServiceError
from marketplace import selectors, services
from marketplace.models import AllowedRegistry, GpuType, NodePool, Region
from tests.conftest import signed_in_client, token_client

STAFF_CATALOG = reverse("marketplace:staff_catalog")


def test_gpu_type_update_changes_the_fields_given_and_audits_them(catalog, staff_user):
    gpu_type = catalog.gpu("h100-80gb")

    services.gpu_type_update(
        gpu_type=gpu_type,
        changes={"architecture": "Hopper (SXM5)", "is_active": False},
        user=staff_user,
    )

    gpu_type = GpuType.objects.get(slug="h100-80gb")
    assert (gpu_type.architecture, gpu_type.is_active) == ("Hopper (SXM5)", False)
    event = AuditEvent.objects.get(action="gpu_type.changed")
    assert (event.actor, event.target_id) == (staff_user, str(gpu_type.pk))
    assert event.metadata == {"changed": ["architecture", "is_active"]}


def test_node_pool_update_refuses_capacity_fields_and_saves_nothing(catalog, staff_user):
    pool = NodePool.objects.filter(gpu_type__isnull=False).first()
    before = pool.total_gpus

    with pytest.raises(ServiceError, match="total_gpus"):
        services.node_pool_update(
            pool=pool, changes={"name": "renamed", "total_gpus": 9999}, user=staff_user
        )

    pool.refresh_from_db()
    assert (pool.total_gpus, pool.name != "renamed") == (before, True)
    assert not AuditEvent.objects.filter(action="node_pool.changed").exists()


def test_node_pool_update_is_audited(catalog, staff_user):
    pool = NodePool.objects.filter(gpu_type__isnull=False).first()

    services.node_pool_update(pool=pool, changes={"name": "Renamed pool"}, user=staff_user)

    assert NodePool.objects.get(pk=pool.pk).name == "Renamed pool"
    event = AuditEvent.objects.get(action="node_pool.changed")
    assert event.target_id == str(pool.pk) and event.metadata == {"changed": ["name"]}


def test_allowed_registry_add_normalises_and_audits_once(catalog, staff_user):
    first = services.allowed_registry_add(
        host="  Registry.Example.com:5000 ", path_prefix="/acme/", note="partner", user=staff_user
    )
    again = services.allowed_registry_add(
        host="registry.example.com:5000", path_prefix="acme", user=staff_user
    )

    assert first == again
    assert (first.host, first.path_prefix, first.note) == (
        "registry.example.com:5000",
        "acme",
        "partner",
    )
    assert AuditEvent.objects.filter(action="registry.allowed").count() == 1


def test_allowed_registry_add_needs_a_host(catalog, staff_user):
    before = AllowedRegistry.objects.count()
    with pytest.raises(ServiceError) as refused:
        services.allowed_registry_add(host="   ", user=staff_user)
    assert refused.value.field == "host"
    assert AllowedRegistry.objects.count() == before


def test_allowed_registry_remove_deletes_and_audits(catalog, staff_user):
    registry = services.allowed_registry_add(host="quay.io", path_prefix="acme", user=staff_user)

    services.allowed_registry_remove(registry=registry, user=staff_user)

    assert not AllowedRegistry.objects.filter(host="quay.io", path_prefix="acme").exists()
    event = AuditEvent.objects.get(action="registry.removed")
    assert (event.actor, event.target_repr) == (staff_user, "quay.io/acme")


def test_staff_pages_add_and_remove_a_registry_and_edit_a_pool(catalog, staff_user, world):
    client = signed_in_client(staff_user, world.tenant)

    added = client.post(
        reverse("marketplace:staff_registry_add"), {"host": "Quay.io", "path_prefix": "team/"}
    )
    assert added.status_code == 302 and added["Location"] == STAFF_CATALOG
    registry = AllowedRegistry.objects.get(host="quay.io", path_prefix="team")
    removed = client.post(reverse("marketplace:staff_registry_remove", args=[registry.pk]))
    assert removed.status_code == 302
    assert not AllowedRegistry.objects.filter(pk=registry.pk).exists()

    pool = NodePool.objects.filter(gpu_type__isnull=False).first()
    page = client.post(
        reverse("marketplace:staff_pool_edit", args=[pool.pk]),
        {
            "name": "Edited",
            "tier": pool.tier,
            "node_selector": "{}",
            "is_active": "on",
            "preemption_threshold": "0.8",
            "memory_margin": "0.20",
            "locality_weight": "1.50",
            "topology_label": "topology.kubernetes.io/zone",
        },
        follow=True,
    )
    assert page.redirect_chain == [(STAFF_CATALOG, 302)]
    assert NodePool.objects.get(pk=pool.pk).name == "Edited"
    assert AuditEvent.objects.get(action="node_pool.changed").metadata["changed"][0] == "name"
    audited = AuditEvent.objects.exclude(action__startswith="auth.").order_by("pk")
    assert [e.action for e in audited] == [
        "registry.allowed",
        "registry.removed",
        "node_pool.changed",
    ]


@pytest.mark.parametrize(
    "selector",
    [
        '["pool"]',
        '{"Bad Key": "x"}',
        '{"pool": "-dash"}',
        '{"pool": 7}',
        '{"pool": "%s"}' % ("x" * 64),
    ],
)
def test_the_staff_pool_page_refuses_a_node_selector_kubernetes_would_not_take(
    catalog, staff_user, selector
):
    """The rule lives in the pool service: the page is held to it as the API is."""
    client = signed_in_client(staff_user)
    pool = NodePool.objects.filter(gpu_type__isnull=False).first()
    before = pool.node_selector
    page = client.post(
        reverse("marketplace:staff_pool_edit", args=[pool.pk]),
        {
            "name": pool.name,
            "tier": pool.tier,
            "node_selector": selector,
            "is_active": "on",
            "preemption_threshold": "0.8",
            "memory_margin": "0.20",
            "locality_weight": "1.50",
            "topology_label": "topology.kubernetes.io/zone",
        },
    )
    assert page.status_code == 200  # the form again, with the error
    assert page.context["form"].errors["node_selector"]
    assert NodePool.objects.get(pk=pool.pk).node_selector == before
    assert not AuditEvent.objects.filter(action="node_pool.changed").exists()


def test_staff_set_a_pools_preemption_knobs_with_their_meaning_on_the_page(catalog, staff_user):
    client = signed_in_client(staff_user)
    pool = NodePool.objects.filter(gpu_type__isnull=False).first()
    url = reverse("marketplace:staff_pool_edit", args=[pool.pk])
    page = client.get(url).content.decode()
    assert "Preemption happens in this pool only while" in page
    assert "On-demand jobs of other organisations are never preempted" in page
    assert "Share of each GPU's memory kept in reserve" in page
    form = {
        "name": pool.name,
        "tier": pool.tier,
        "node_selector": json.dumps(pool.node_selector),
        "is_active": "on",
        "memory_margin": "0.20",
        "locality_weight": "1.50",
        "topology_label": "topology.kubernetes.io/zone",
    }

    refused = client.post(url, {**form, "preemption_threshold": "1.5"})
    assert refused.status_code == 200
    assert refused.context["form"].errors["preemption_threshold"]
    assert NodePool.objects.get(pk=pool.pk).preemption_threshold == Decimal("0.80")

    refused = client.post(url, {**form, "preemption_threshold": "0.5", "memory_margin": "-0.1"})
    assert refused.status_code == 200 and refused.context["form"].errors["memory_margin"]

    saved = client.post(
        url,
        {
            **form,
            "preemption_threshold": "0.5",
            "preempt_other_tenants_spot": "on",
            "memory_margin": "0.3",
        },
    )
    assert saved.status_code == 302
    pool.refresh_from_db()
    assert pool.preemption_threshold == Decimal("0.5") and pool.preempt_other_tenants_spot
    assert pool.memory_margin == Decimal("0.3")
    changed = AuditEvent.objects.get(action="node_pool.changed").metadata["changed"]
    assert {"preemption_threshold", "preempt_other_tenants_spot", "memory_margin"} <= set(changed)


def test_staff_set_a_pools_isolated_runtime_and_offers_say_so(catalog, staff_user, world):
    client = signed_in_client(staff_user)
    pool = NodePool.objects.filter(gpu_type__isnull=False, node_count__gt=0).first()
    url = reverse("marketplace:staff_pool_edit", args=[pool.pk])
    edit_page = client.get(url).content.decode()
    assert "isolated runtime" in edit_page.lower() and "e.g. kata or gvisor" in edit_page
    form = {
        "name": pool.name,
        "tier": pool.tier,
        "node_selector": json.dumps(pool.node_selector),
        "is_active": "on",
        "preemption_threshold": "0.8",
        "memory_margin": "0.20",
        "locality_weight": "1.50",
        "topology_label": "topology.kubernetes.io/zone",
    }
    for bad in ("Kata", "-kata", "kata_1", "k" * 64):
        refused = client.post(url, {**form, "runtime_class_name": bad})
        assert refused.status_code == 200
        assert refused.context["form"].errors["runtime_class_name"], bad
    assert NodePool.objects.get(pk=pool.pk).runtime_class_name == ""
    assert client.post(url, {**form, "runtime_class_name": "kata-qemu"}).status_code == 302
    assert NodePool.objects.get(pk=pool.pk).runtime_class_name == "kata-qemu"
    changed = AuditEvent.objects.get(action="node_pool.changed").metadata["changed"]
    assert "runtime_class_name" in changed

    # Offers served only by such pools say so, on the page and in the API.
    tenant_api = token_client(world.member, world.tenant)
    rows = tenant_api.get("/api/v1/offers", {"tier": pool.tier}).json()["results"]
    serving = [
        NodePool.objects.filter(
            is_active=True, gpu_type__slug=r["gpu_type"], region__slug=r["region"], tier=r["tier"]
        )
        for r in rows
    ]
    for row, pools in zip(rows, serving, strict=True):
        expected = pools.exists() and not pools.filter(runtime_class_name="").exists()
        assert row["isolated_runtime"] is expected, row
    assert any(row["isolated_runtime"] for row in rows)
    page = signed_in_client(world.member, world.tenant).get(reverse("marketplace:offers"))
    page = page.content.decode()
    assert page.count('data-testid="isolated-runtime"') == sum(r["isolated_runtime"] for r in rows)


# --- default region ----


def test_default_region_is_the_first_with_a_cpu_pool_on_a_configured_backend(catalog, settings):
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    with_cpu = Region.objects.filter(
        pools__gpu_type__isnull=True, pools__backend="kubernetes", pools__is_active=True
    ).order_by("pk")
    assert selectors.default_region() == with_cpu.first()

    first = with_cpu.first()
    NodePool.objects.filter(region=first, gpu_type__isnull=True).update(is_active=False)
    assert selectors.default_region() == with_cpu.exclude(pk=first.pk).first()


def test_default_region_follows_the_configured_backends(catalog, settings):
    local = Region.objects.get(slug="local")
    NodePool.objects.create(
        slug="local-cpu-on-demand", name="CPU · local", region=local, backend="local"
    )
    settings.COMPUTE_BACKENDS = ["local"]
    assert selectors.default_region() == local

    local.is_active = False
    local.save()
    assert selectors.default_region() is None
