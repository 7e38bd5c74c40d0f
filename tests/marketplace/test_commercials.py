"""Tenant pricing (negotiated discount) and quotas: services and the staff page."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from console.models import AuditEvent
from console.service_errors import ServiceError
from marketplace import services
from marketplace.models import TenantPricing, TenantQuota
from marketplace.selectors import offers
from tests.conftest import signed_in_client

D = Decimal


def a100_on_demand(tenant):
    (offer,) = offers(tenant=tenant, gpu_type="a100-80gb", region="us-west", tier="on_demand")
    return offer.unit_price


def test_discount_applies_to_that_tenant_only_and_is_audited(
    catalog, world, other_world, staff_user
):
    services.tenant_pricing_set(
        tenant=world.tenant, discount_percent=D("12.5"), note="3-year deal", user=staff_user
    )

    assert a100_on_demand(world.tenant) == D("1.566250")  # 1.79 × 0.875
    assert a100_on_demand(other_world.tenant) == D("1.790000")
    assert a100_on_demand(None) == D("1.790000")
    event = AuditEvent.objects.get(action="tenant_pricing.changed")
    assert (event.tenant, event.actor) == (world.tenant, staff_user)
    assert event.metadata == {"from": "0", "to": "12.5", "note": "3-year deal"}

    services.tenant_pricing_set(
        tenant=world.tenant, discount_percent=D(0), note="", user=staff_user
    )
    assert a100_on_demand(world.tenant) == D("1.790000")
    assert TenantPricing.objects.count() == 1


@pytest.mark.parametrize("percent", [D(-1), D(100), D(150)])
def test_discount_out_of_range_is_refused(catalog, world, staff_user, percent):
    with pytest.raises(ServiceError) as raised:
        services.tenant_pricing_set(
            tenant=world.tenant, discount_percent=percent, note="", user=staff_user
        )
    assert raised.value.field == "discount_percent"
    assert not TenantPricing.objects.exists()


def test_quotas_are_set_updated_and_cleared_with_audit(catalog, world, staff_user):
    h100 = catalog.gpu("h100-80gb")

    per_type = services.tenant_quota_set(
        tenant=world.tenant, gpu_type=h100, max_gpus=16, max_concurrent_jobs=None, user=staff_user
    )
    tenant_wide = services.tenant_quota_set(
        tenant=world.tenant, gpu_type=None, max_gpus=64, max_concurrent_jobs=4, user=staff_user
    )
    services.tenant_quota_set(
        tenant=world.tenant, gpu_type=h100, max_gpus=32, max_concurrent_jobs=None, user=staff_user
    )

    assert TenantQuota.objects.for_tenant(world.tenant).count() == 2
    per_type.refresh_from_db()
    assert per_type.max_gpus == 32
    assert (tenant_wide.max_gpus, tenant_wide.max_concurrent_jobs) == (64, 4)
    assert (
        AuditEvent.objects.filter(action="tenant_quota.changed", tenant=world.tenant).count() == 3
    )

    cleared = services.tenant_quota_set(
        tenant=world.tenant, gpu_type=h100, max_gpus=None, max_concurrent_jobs=None, user=staff_user
    )
    assert cleared is None
    assert list(TenantQuota.objects.for_tenant(world.tenant)) == [tenant_wide]
    event = AuditEvent.objects.get(action="tenant_quota.cleared")
    assert event.metadata["gpu_type"] == "h100-80gb"


def test_a_per_gpu_type_quota_cannot_carry_max_concurrent_jobs(catalog, world, staff_user):
    with pytest.raises(ServiceError) as raised:
        services.tenant_quota_set(
            tenant=world.tenant,
            gpu_type=catalog.gpu("h100-80gb"),
            max_gpus=8,
            max_concurrent_jobs=2,
            user=staff_user,
        )
    assert raised.value.field == "max_concurrent_jobs"
    assert not TenantQuota.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="tenant_quota").exists()


@pytest.mark.parametrize("field", ["max_gpus", "max_concurrent_jobs"])
def test_negative_limits_are_refused(catalog, world, staff_user, field):
    limits = {"max_gpus": None, "max_concurrent_jobs": None, field: -1}
    with pytest.raises(ServiceError) as raised:
        services.tenant_quota_set(tenant=world.tenant, gpu_type=None, user=staff_user, **limits)
    assert raised.value.field == field


def test_quotas_of_one_tenant_leave_the_other_alone(catalog, world, other_world, staff_user):
    services.tenant_quota_set(
        tenant=world.tenant, gpu_type=None, max_gpus=8, max_concurrent_jobs=1, user=staff_user
    )
    services.tenant_quota_set(
        tenant=other_world.tenant,
        gpu_type=None,
        max_gpus=None,
        max_concurrent_jobs=None,
        user=staff_user,
    )
    assert TenantQuota.objects.for_tenant(world.tenant).count() == 1


# --- staff page ----


def test_staff_sets_discount_and_quota_on_the_page(catalog, world, staff_user):
    client = signed_in_client(staff_user)
    url = reverse("marketplace:staff_tenant_commercials", args=[world.tenant.slug])

    saved = client.post(
        url, {"form": "pricing", "pricing-discount_percent": "10", "pricing-note": "deal"}
    )
    assert saved.status_code == 302
    assert TenantPricing.objects.get(tenant=world.tenant).discount_percent == D(10)

    quota = client.post(
        url, {"form": "quota", "quota-gpu_type": "h100-80gb", "quota-max_gpus": "16"}
    )
    assert quota.status_code == 302
    assert TenantQuota.objects.get(tenant=world.tenant).max_gpus == 16

    refused = client.post(
        url,
        {
            "form": "quota",
            "quota-gpu_type": "h100-80gb",
            "quota-max_gpus": "16",
            "quota-max_concurrent_jobs": "2",
        },
    )
    assert refused.status_code == 200
    assert refused.context["quota_form"].errors["max_concurrent_jobs"]
    assert TenantQuota.objects.get(tenant=world.tenant).max_concurrent_jobs is None
