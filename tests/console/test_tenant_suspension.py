"""Staff suspend and reactivate an organisation (issue 14, "Platform administration"):
running jobs pause through the state machine, launches and resumes are refused, members
see a banner, everything is audited with the staff e-mail, and only staff can do it."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.models import AuditEvent
from console.service_errors import ServiceError
from console.tenant_admin import TenantSuspended, tenant_reactivate, tenant_suspend
from jobs.actors import Actor
from jobs.models import Job, JobEvent, JobStatus, WaitKind
from jobs.services import job_cancel, job_resume
from marketplace.models import NodePool
from tests.conftest import signed_in_client, token_client
from tests.factories import UserFactory
from tests.jobs_helpers import advance_to, submit

REASON = "unpaid invoices since March"
MESSAGE = f"Your organisation is suspended: {REASON}. Contact support."


@pytest.fixture
def staff(db):
    return UserFactory(email="staff@gpugeek.test", is_staff=True)


@pytest.fixture
def running(world, catalog):
    return advance_to(submit(world, "train"), JobStatus.RUNNING)


def api_url(slug: str, action: str) -> str:
    return f"/api/v1/staff/tenants/{slug}/{action}"


def staff_api(staff, world):
    # Staff use the API with a token of any organisation they belong to; here their own.
    world.tenant.memberships.create(user=staff, role="viewer")
    return token_client(staff, world.tenant)


def test_suspending_pauses_running_jobs_through_the_state_machine(world, staff, running):
    tenant = tenant_suspend(tenant=world.tenant, reason=REASON, user=staff)

    assert tenant.suspended_at is not None and tenant.suspension_reason == REASON
    running.refresh_from_db()
    assert running.status == JobStatus.PAUSING
    assert not running.paused_by_budget
    event = JobEvent.objects.filter(job=running).last()
    assert (event.from_status, event.to_status) == (JobStatus.RUNNING, JobStatus.PAUSING)
    assert event.actor == "suspension"
    assert "organisation suspended" in event.reason and REASON in event.reason
    audit = AuditEvent.objects.get(action="tenant.suspended")
    assert (audit.actor_label, audit.tenant, audit.metadata["reason"]) == (
        "staff@gpugeek.test",
        world.tenant,
        REASON,
    )
    assert AuditEvent.objects.filter(
        action="job.paused_by_suspension", target_id=str(running.pk)
    ).exists()


def test_another_tenants_jobs_are_untouched(world, other_world, staff, catalog):
    other_world.tenant.may_run_on_host = True
    other_world.tenant.save()
    theirs = advance_to(submit(other_world, "theirs"), JobStatus.RUNNING)
    tenant_suspend(tenant=world.tenant, reason=REASON, user=staff)
    theirs.refresh_from_db()
    assert theirs.status == JobStatus.RUNNING


def test_suspension_is_idempotent_and_needs_a_reason(world, staff, running):
    with pytest.raises(ServiceError) as refused:
        tenant_suspend(tenant=world.tenant, reason="   ", user=staff)
    assert refused.value.field == "reason"
    first = tenant_suspend(tenant=world.tenant, reason=REASON, user=staff)
    again = tenant_suspend(tenant=world.tenant, reason="another reason", user=staff)
    assert (again.suspended_at, again.suspension_reason) == (first.suspended_at, REASON)
    assert AuditEvent.objects.filter(action="tenant.suspended").count() == 1
    assert JobEvent.objects.filter(job=running, to_status=JobStatus.PAUSING).count() == 1
    tenant_reactivate(tenant=world.tenant, user=staff)
    tenant_reactivate(tenant=world.tenant, user=staff)
    assert AuditEvent.objects.filter(action="tenant.reactivated").count() == 1


def test_only_staff_may_suspend(world):
    with pytest.raises(ServiceError) as refused:
        tenant_suspend(tenant=world.tenant, reason=REASON, user=world.owner)
    assert refused.value.code == "forbidden"


def test_a_suspended_tenant_cannot_launch_by_api_or_form(world, staff, catalog, settings):
    tenant_suspend(tenant=world.tenant, reason=REASON, user=staff)
    api = token_client(world.member, world.tenant)
    response = api.post(
        "/api/v1/jobs",
        {"name": "x", "image": "python-3.11", "command": ["true"], "cpus": 1},
        format="json",
    )
    assert response.status_code == 403, response.content
    assert response.json()["detail"] == MESSAGE

    settings.COMPUTE_BACKENDS = ["local"]
    client = signed_in_client(world.member, world.tenant)
    page = client.post(
        reverse("jobs:launch"),
        {
            "name": "form job",
            "gpus_per_node": "0",
            "cpus": "1",
            "nodes": "1",
            "region": "local",
            "spot_ratio": "0",
            "image": "python-3.11",
            "command": "python -c 'print(42)'",
            "priority": "normal",
            "max_runtime_minutes": "60",
            "auto_release": "on",
        },
    )
    assert page.status_code == 200
    assert MESSAGE in page.context["form"].non_field_errors()
    assert not Job.objects.exists()


def test_resume_is_refused_while_suspended_and_allowed_after(world, staff, running):
    tenant_suspend(tenant=world.tenant, reason=REASON, user=staff)
    paused = advance_to(running, JobStatus.PAUSED)  # the backend reports the pause done
    with pytest.raises(TenantSuspended) as refused:
        job_resume(job=paused, actor=Actor.of_user(world.member))
    assert refused.value.message == MESSAGE

    api = token_client(world.member, world.tenant)
    response = api.post(f"/api/v1/jobs/{paused.pk}/resume")
    assert response.status_code == 403 and response.json()["detail"] == MESSAGE

    tenant_reactivate(tenant=world.tenant, user=staff)
    paused.refresh_from_db()
    assert paused.status == JobStatus.PAUSED  # nothing resumes by itself
    response = api.post(f"/api/v1/jobs/{paused.pk}/resume")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == JobStatus.RESUMING
    audit = AuditEvent.objects.get(action="tenant.reactivated")
    assert audit.actor_label == "staff@gpugeek.test"


def test_queued_jobs_wait_for_the_suspension_and_are_admitted_after(
    world, other_world, staff, catalog
):
    other_world.tenant.may_run_on_host = True
    other_world.tenant.save()
    pool = NodePool.objects.get(backend="local", gpu_type=None, tier="on_demand")
    big = submit(other_world, "big", cpus=pool.allocatable_vcpus)  # fills the pool
    queued = submit(world, "later")
    assert (queued.status, queued.wait_kind) == (JobStatus.QUEUED, WaitKind.CAPACITY)
    tenant_suspend(tenant=world.tenant, reason=REASON, user=staff)
    queued.refresh_from_db()
    assert (queued.wait_kind, queued.status_reason) == (
        WaitKind.SUSPENDED,
        "your organisation is suspended",
    )
    # Compute frees up: still not admitted while suspended, and it holds back no one else.
    job_cancel(job=big, actor=Actor.of_user(other_world.member))
    queued.refresh_from_db()
    assert (queued.status, queued.wait_kind) == (JobStatus.QUEUED, WaitKind.SUSPENDED)
    theirs = submit(other_world, "theirs")
    assert theirs.status == JobStatus.DISPATCHING
    tenant_reactivate(tenant=world.tenant, user=staff)
    queued.refresh_from_db()
    assert queued.status == JobStatus.DISPATCHING


def test_members_see_a_banner_on_every_page(world, staff, catalog):
    client = signed_in_client(world.member, world.tenant)
    assert "is suspended since" not in client.get(reverse("dashboard")).content.decode()
    tenant_suspend(tenant=world.tenant, reason=REASON, user=staff)
    for url in (reverse("dashboard"), reverse("jobs:list"), reverse("members")):
        page = client.get(url).content.decode()
        assert "This organisation is suspended since" in page, url
        assert REASON in page
        assert "stay paused until you resume them" in page


def test_staff_pages_suspend_with_a_reason_and_reactivate_with_a_confirmation(world, staff):
    client = signed_in_client(staff)
    detail = reverse("staff_tenant_detail", args=[world.tenant.slug])
    suspend = reverse("staff_tenant_suspend", args=[world.tenant.slug])
    reactivate = reverse("staff_tenant_reactivate", args=[world.tenant.slug])
    assert suspend in client.get(detail).content.decode()

    assert client.get(suspend).status_code == 200
    blank = client.post(suspend, {"reason": ""})
    assert blank.status_code == 200 and "reason" in blank.context["form"].errors
    done = client.post(suspend, {"reason": REASON})
    assert done.status_code == 302 and done["Location"] == detail
    world.tenant.refresh_from_db()
    assert world.tenant.suspension_reason == REASON
    listing = client.get(reverse("staff_tenants")).content.decode()
    assert "suspended" in listing

    page = client.get(detail).content.decode()
    assert REASON in page and reactivate in page
    confirm = client.get(reactivate)
    assert confirm.status_code == 200 and "Reactivate" in confirm.content.decode()
    world.tenant.refresh_from_db()
    assert world.tenant.suspended_at is not None  # asking changed nothing
    assert client.post(reactivate).status_code == 302
    world.tenant.refresh_from_db()
    assert world.tenant.suspended_at is None


def test_staff_api_suspends_and_reactivates(world, staff):
    api = staff_api(staff, world)
    missing = api.post(api_url(world.tenant.slug, "suspend"), {}, format="json")
    assert missing.status_code == 400 and "reason" in missing.json()
    blank = api.post(api_url(world.tenant.slug, "suspend"), {"reason": "  "}, format="json")
    assert blank.status_code == 400
    done = api.post(api_url(world.tenant.slug, "suspend"), {"reason": REASON}, format="json")
    assert done.status_code == 200, done.content
    assert done.json()["suspension_reason"] == REASON and done.json()["suspended_at"]
    again = api.post(api_url(world.tenant.slug, "suspend"), {"reason": REASON}, format="json")
    assert again.status_code == 200
    back = api.post(api_url(world.tenant.slug, "reactivate"))
    assert back.status_code == 200 and back.json()["suspended_at"] is None
    assert api.post(api_url("nope", "reactivate")).status_code == 404


@pytest.mark.parametrize("role", ["owner", "member"])
def test_non_staff_get_404_on_the_staff_endpoints_and_pages(world, role):
    user = getattr(world, role)
    api = token_client(user, world.tenant)
    assert api.post(api_url(world.tenant.slug, "suspend"), {"reason": "x"}).status_code == 404
    assert api.post(api_url(world.tenant.slug, "reactivate")).status_code == 404
    client = signed_in_client(user, world.tenant)
    for name in ("staff_tenant_suspend", "staff_tenant_reactivate"):
        url = reverse(name, args=[world.tenant.slug])
        assert client.get(url).status_code == 404
        assert client.post(url, {"reason": "x"}).status_code == 404
    world.tenant.refresh_from_db()
    assert world.tenant.suspended_at is None
