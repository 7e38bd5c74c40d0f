"""Fair share in admission: among queued jobs of one priority, the organisation with the
lowest weighted share of the pool (held now, plus what it held over the last hour in
work that has ended) goes first; staff weigh organisations; an organisation alone takes
the whole pool; shares never preempt; a job passed over says why."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from console.models import AuditEvent
from jobs import services
from jobs.expectations.selectors import job_expectations
from jobs.models import Job, JobStatus, WaitKind
from jobs.services.admission import FAIR_SHARE_TURN
from jobs.services.fair_share import WINDOW
from marketplace.demo import seed_catalog
from marketplace.models import GpuType, NodePool, Region, TenantQuota
from tests import jobs_helpers
from tests.conftest import make_world, signed_in_client, token_client
from tests.factories import UserFactory
from tests.jobs_helpers import advance_to


@pytest.fixture
def h100(db, settings) -> NodePool:
    """One local 8-GPU pool, closed (no allocatable GPUs) until a test opens it, so the
    queue builds up first as two organisations flood it."""
    settings.COMPUTE_BACKENDS = ["local"]
    seed_catalog()
    return NodePool.objects.create(
        slug="t-h100",
        name="t-h100",
        region=Region.objects.get(slug="local"),
        backend="local",
        gpu_type=GpuType.objects.get(slug="h100-80gb"),
        node_count=1,
        gpus_per_node=8,
        total_gpus=8,
        allocatable_gpus=0,
        vcpus_per_node=64,
        allocatable_vcpus=64,
    )


@pytest.fixture
def tenants(world, other_world):
    # New organisations get a default quota; this is about sharing capacity.
    TenantQuota.objects.filter(tenant__in=[world.tenant, other_world.tenant]).delete()
    return world, other_world


def flood(world, prefix: str, count: int, *, priority: str = "normal") -> list[Job]:
    return [
        jobs_helpers.submit(
            world,
            f"{prefix}-{n}",
            gpu_type="h100-80gb",
            region="local",
            gpus_per_node=1,
            cpus=None,
            priority=priority,
        )
        for n in range(count)
    ]


def open_pool(pool: NodePool, gpus: int = 8) -> list[Job]:
    NodePool.objects.filter(pk=pool.pk).update(allocatable_gpus=gpus)
    return services.jobs_admit(pools=[pool.pk])


def admitted_by_tenant(admitted: list[Job]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in admitted:
        counts[job.tenant.slug] = counts.get(job.tenant.slug, 0) + 1
    return counts


def test_two_organisations_flooding_a_pool_each_get_half(tenants, h100):
    acme, globex = tenants
    first = flood(acme, "a", 10)  # all of Acme's come first
    flood(globex, "g", 10)

    admitted = open_pool(h100)

    assert admitted_by_tenant(admitted) == {"acme": 4, "globex": 4}
    # Ties go first come, first served: Acme's first job before Globex's first.
    assert admitted[0].pk == first[0].pk


def test_weights_divide_the_pool(tenants, h100):
    acme, globex = tenants
    acme.tenant.fair_share_weight = Decimal("3")
    acme.tenant.save()
    flood(globex, "g", 10)  # Globex's come first this time
    flood(acme, "a", 10)

    assert admitted_by_tenant(open_pool(h100)) == {"acme": 6, "globex": 2}


def test_an_organisation_alone_takes_the_whole_pool(tenants, h100):
    acme, _ = tenants
    flood(acme, "a", 10)
    assert admitted_by_tenant(open_pool(h100)) == {"acme": 8}


def test_a_third_organisation_gets_its_turn_as_jobs_end(tenants, h100):
    acme, globex = tenants
    initech = make_world("initech")
    TenantQuota.objects.filter(tenant=initech.tenant).delete()
    acme_jobs = flood(acme, "a", 10)
    flood(globex, "g", 10)
    open_pool(h100)
    late = flood(initech, "i", 2)  # queued behind everything, FIFO-wise

    # One of Acme's ends: the freed GPU goes to Initech (holding nothing), not to
    # Acme's or Globex's earlier jobs.
    advance_to(Job.objects.get(pk=acme_jobs[0].pk), JobStatus.SUCCEEDED)
    admitted = services.jobs_admit(pools=[h100.pk])
    assert [job.pk for job in admitted] == [late[0].pk]


def test_work_ended_within_the_window_counts_against_its_organisation(tenants, h100):
    acme, globex = tenants
    NodePool.objects.filter(pk=h100.pk).update(allocatable_gpus=8)
    # Acme used the whole pool for the last hour; those jobs have just ended.
    used = flood(acme, "earlier", 8)
    now = timezone.now()
    for job in used:
        job.refresh_from_db()
        advance_to(job, JobStatus.RUNNING, at=now - WINDOW)
        advance_to(job, JobStatus.SUCCEEDED, at=now - timedelta(seconds=1))
    NodePool.objects.filter(pk=h100.pk).update(allocatable_gpus=0)
    flood(acme, "a", 8)
    flood(globex, "g", 8)

    # Acme's share is still about the whole pool: Globex goes first until they're even.
    assert admitted_by_tenant(open_pool(h100)) == {"globex": 8}


def test_a_job_passed_over_by_fair_share_says_so(tenants, h100):
    acme, globex = tenants
    acme_jobs = flood(acme, "a", 3)
    globex_jobs = flood(globex, "g", 3)
    open_pool(h100, gpus=3)

    for job in [*acme_jobs, *globex_jobs]:
        job.refresh_from_db()
    waiting = [job for job in [*acme_jobs, *globex_jobs] if job.status == JobStatus.QUEUED]
    assert len(waiting) == 3
    # Globex's second job went before Acme's third: the latter waits by fair share.
    passed_over = [job for job in waiting if job.tenant_id == acme.tenant.pk]
    assert [job.wait_kind for job in passed_over] == [WaitKind.FAIR_SHARE]
    assert passed_over[0].status_reason == FAIR_SHARE_TURN.message
    because = job_expectations([passed_over[0]])[passed_over[0].pk].because
    assert because == (
        "organisations using less of its pool go first among equal priorities (fair share)"
    )


def test_priorities_still_come_before_shares(tenants, h100):
    acme, globex = tenants
    flood(acme, "a", 4)
    critical = flood(globex, "g", 8, priority="critical")
    admitted = open_pool(h100)
    assert {job.pk for job in admitted} == {job.pk for job in critical}


def test_shares_never_preempt(tenants, h100):
    acme, globex = tenants
    NodePool.objects.filter(pk=h100.pk).update(allocatable_gpus=8)
    acme_jobs = flood(acme, "a", 8)
    for job in acme_jobs:
        job.refresh_from_db()
        advance_to(job, JobStatus.RUNNING)
    flood(globex, "g", 4)
    for _ in range(3):
        services.jobs_admit()
    assert Job.objects.filter(tenant=acme.tenant, status=JobStatus.RUNNING).count() == 8
    assert not Job.objects.filter(tenant=globex.tenant).exclude(status=JobStatus.QUEUED)


# --- staff set the weight --------------------------------------------------------------------


@pytest.fixture
def staff(db):
    return UserFactory(email="staff@gpugeek.test", is_staff=True)


def test_staff_set_the_weight_on_the_tenant_page_with_its_bounds(world, staff):
    client = signed_in_client(staff)
    url = reverse("marketplace:staff_tenant_commercials", args=[world.tenant.slug])
    page = client.get(url).content.decode()
    assert "Fair share of shared pools" in page and 'value="1.00"' in page

    refused = client.post(url, {"form": "share", "share-weight": "0"})
    assert refused.status_code == 200
    assert "Ensure this value is greater than or equal to 0.01." in refused.content.decode()
    saved = client.post(url, {"form": "share", "share-weight": "2.5"})
    assert saved.status_code == 302
    world.tenant.refresh_from_db()
    assert world.tenant.fair_share_weight == Decimal("2.50")
    event = AuditEvent.objects.get(action="tenant.fair_share_set")
    assert event.metadata == {"from": "1.00", "to": "2.50"}
    detail = client.get(reverse("staff_tenant_detail", args=[world.tenant.slug]))
    assert "fair-share weight 2.50" in detail.content.decode()


def test_staff_set_the_weight_through_the_api_and_others_get_404(world, staff):
    world.tenant.memberships.create(user=staff, role="viewer")
    api = token_client(staff, world.tenant)
    url = f"/api/v1/staff/tenants/{world.tenant.slug}"
    answer = api.patch(url, {"fair_share_weight": "3"}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["fair_share_weight"] == "3.00"
    too_big = api.patch(url, {"fair_share_weight": "1000"}, format="json")
    assert too_big.status_code == 400
    assert "fair_share_weight" in too_big.json() and too_big.json()["code"] == "invalid"

    owner = token_client(world.owner, world.tenant)
    assert owner.patch(url, {"fair_share_weight": "9"}, format="json").status_code == 404
    world.tenant.refresh_from_db()
    assert world.tenant.fair_share_weight == Decimal("3.00")


def test_the_expected_start_follows_the_fair_order(tenants, h100):
    acme, globex = tenants
    NodePool.objects.filter(pk=h100.pk).update(allocatable_gpus=8)

    def launch(world, name, gpus, minutes):
        return jobs_helpers.submit(
            world,
            name,
            gpu_type="h100-80gb",
            region="local",
            gpus_per_node=gpus,
            cpus=None,
            max_runtime_minutes=minutes,
        )

    advance_to(launch(acme, "a-big", 6, 60), JobStatus.RUNNING)
    # Ends first: 2 GPUs free in about 30 min, room for one of the two queued below.
    advance_to(launch(globex, "g-small", 2, 30), JobStatus.RUNNING)
    acme_next = launch(acme, "a-next", 2, 60)  # queued first…
    globex_next = launch(globex, "g-next", 2, 60)  # …but Globex holds less of the pool
    expected = job_expectations([acme_next, globex_next])
    assert expected[globex_next.pk].expected_start < expected[acme_next.pk].expected_start
