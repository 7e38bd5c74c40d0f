"""The policy for new organisations (issue 32 item 12): the quota a new organisation
starts with, set by staff and explained on its dashboard, and, where Stripe is set up,
credit (or a paid invoice) before the first launch."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.models import AuditEvent
from console.service_errors import ServiceError
from console.services.tenants import tenant_create
from jobs.services import JobSpec, job_submit
from marketplace.models import TenantQuota
from marketplace.selectors import new_tenant_policy
from tests.billing.conftest import give_credit
from tests.conftest import signed_in_client, token_client
from tests.factories import UserFactory

POLICY_URL = reverse("marketplace:staff_new_tenant_policy")


def new_organisation(name="Fresh Labs"):
    owner = UserFactory(email=f"owner@{name.split()[0].lower()}.test")
    return tenant_create(name=name, owner=owner), owner


def quota_of(tenant):
    return TenantQuota.objects.for_tenant(tenant).get(gpu_type=None)


def test_a_new_organisation_starts_with_the_default_quota(db):
    tenant, _ = new_organisation()

    quota = quota_of(tenant)
    assert (quota.max_gpus, quota.max_concurrent_jobs) == (8, 4)
    event = AuditEvent.objects.get(action="tenant_quota.default_applied")
    assert event.tenant == tenant and event.metadata["max_gpus"] == 8


def test_staff_set_the_policy_for_organisations_created_afterwards(db, staff_user):
    before, _ = new_organisation("Early Co")
    staff = signed_in_client(staff_user)

    response = staff.post(
        POLICY_URL,
        {"default_max_gpus": "2", "default_max_concurrent_jobs": "", "require_credit": ""},
    )

    assert response.status_code == 302
    policy = new_tenant_policy()
    assert (policy.default_max_gpus, policy.default_max_concurrent_jobs) == (2, None)
    assert policy.require_credit is False and policy.updated_by == staff_user
    after, _ = new_organisation("Later Co")
    assert (quota_of(after).max_gpus, quota_of(after).max_concurrent_jobs) == (2, None)
    assert quota_of(before).max_gpus == 8  # existing organisations keep theirs
    assert AuditEvent.objects.filter(action="new_tenant_policy.changed").count() == 1
    assert "New organisations" in staff.get(reverse("marketplace:staff_catalog")).content.decode()


def test_no_limits_in_the_policy_gives_no_quota(db, staff_user):
    signed_in_client(staff_user).post(
        POLICY_URL,
        {"default_max_gpus": "", "default_max_concurrent_jobs": "", "require_credit": "on"},
    )
    tenant, _ = new_organisation()
    assert not TenantQuota.objects.for_tenant(tenant).exists()


def test_the_policy_form_refuses_bad_input_and_non_staff(db, staff_user, world):
    response = signed_in_client(staff_user).post(
        POLICY_URL, {"default_max_gpus": "-1", "default_max_concurrent_jobs": "x"}
    )
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert "default_max_gpus" in errors and "default_max_concurrent_jobs" in errors
    member = signed_in_client(world.owner, world.tenant)
    assert member.post(POLICY_URL, {"default_max_gpus": "100"}).status_code in (403, 404)
    assert new_tenant_policy().default_max_gpus == 8


def test_the_dashboard_explains_the_limits(db, catalog):
    tenant, owner = new_organisation()
    html = signed_in_client(owner, tenant).get(reverse("dashboard")).content.decode()
    assert 'data-testid="dashboard-limits"' in html
    assert "up to <strong>8 GPUs</strong> at once" in html
    assert "<strong>4 jobs</strong> at a time" in html


def cpu_job(name="first"):
    return JobSpec(name=name, image="python-3.11", command=["true"], cpus=1)


@pytest.fixture
def stripe_on(settings):
    settings.STRIPE_API_KEY = "sk_test_policy"  # no Stripe call is made by the check


def test_with_stripe_a_new_organisation_adds_credit_before_its_first_launch(db, catalog, stripe_on):
    tenant, owner = new_organisation()
    tenant.may_run_on_host = True
    tenant.save(update_fields=["may_run_on_host"])

    with pytest.raises(ServiceError) as refused:
        job_submit(tenant=tenant, user=owner, spec=cpu_job())
    assert refused.value.code == "payment_required"
    assert "Add credit" in refused.value.message
    response = token_client(owner, tenant).post(
        "/api/v1/jobs",
        {"name": "api", "image": "python-3.11", "command": ["true"], "cpus": 1},
        format="json",
    )
    assert response.status_code == 402 and response.json()["code"] == "payment_required"
    html = signed_in_client(owner, tenant).get(reverse("dashboard")).content.decode()
    assert 'data-testid="dashboard-credit-required"' in html and "Add credit" in html

    give_credit(tenant, "10.00")
    job = job_submit(tenant=tenant, user=owner, spec=cpu_job("after credit"))
    assert job.pk
    html = signed_in_client(owner, tenant).get(reverse("dashboard")).content.decode()
    assert 'data-testid="dashboard-credit-required"' not in html


def test_credit_is_not_required_without_stripe_or_when_the_policy_says_so(
    db, catalog, staff_user, settings
):
    tenant, owner = new_organisation()
    tenant.may_run_on_host = True
    tenant.save(update_fields=["may_run_on_host"])
    assert job_submit(tenant=tenant, user=owner, spec=cpu_job()).pk  # no Stripe

    settings.STRIPE_API_KEY = "sk_test_policy"
    signed_in_client(staff_user).post(
        POLICY_URL, {"default_max_gpus": "8", "default_max_concurrent_jobs": "4"}
    )
    assert job_submit(tenant=tenant, user=owner, spec=cpu_job("second")).pk
