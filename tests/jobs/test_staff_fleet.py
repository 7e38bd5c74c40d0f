"""The staff fleet page (issue 32 item 11): staff without an organisation land on it;
pools show used and free as admission counts them; organisations with work, the queue
by what it waits for and billing's revenue this month; the spot-reclaim confirmation
lists the jobs and organisations it hits; "Reactivate" is not a danger button."""

from __future__ import annotations

from django.urls import reverse

from jobs.models import JobStatus
from marketplace.models import Tier
from tests.conftest import make_world, signed_in_client
from tests.factories import GpuTypeFactory, JobFactory, NodePoolFactory, RegionFactory, UserFactory
from tests.jobs_helpers import advance_to

FLEET = reverse("jobs:staff_fleet")


def staff():
    return signed_in_client(UserFactory(email="ops@gpugeek.test", is_staff=True))


def gpu_pools():
    region = RegionFactory(slug="us-west")
    h100 = GpuTypeFactory(slug="h100-80gb", model="H100 80GB")
    on_demand = NodePoolFactory(region=region, gpu_type=h100, node_count=4)  # 32 GPUs
    spot = NodePoolFactory(
        region=region, gpu_type=h100, tier=Tier.SPOT, node_count=2, simulated=True
    )
    return on_demand, spot


def test_staff_without_an_organisation_land_on_the_fleet(db):
    response = staff().get(reverse("dashboard"))
    assert response.status_code == 302 and response.url == FLEET
    member = UserFactory(email="new@example.test")
    response = signed_in_client(member).get(reverse("dashboard"))
    assert response.url == reverse("tenant_create")


def test_the_fleet_counts_what_admitted_jobs_hold(db):
    on_demand, spot = gpu_pools()
    acme, globex = make_world("acme"), make_world("globex")
    running = JobFactory(tenant=acme.tenant, pool=on_demand, nodes=2)  # 16 GPUs
    advance_to(running, JobStatus.RUNNING)
    JobFactory(tenant=globex.tenant, pool=on_demand, nodes=1)  # queued: 8 GPUs wanted
    held_spot = JobFactory(
        tenant=globex.tenant, pool=on_demand, spot_pool=spot, nodes=1, spot_nodes=1
    )
    advance_to(held_spot, JobStatus.DISPATCHING)

    page = staff().get(FLEET)

    assert page.status_code == 200
    html = page.content.decode()
    pools = {p.pool.pk: p for p in page.context["pools"]}
    assert (pools[on_demand.pk].held, pools[on_demand.pk].capacity) == (16, 32)
    assert (pools[on_demand.pk].free, pools[on_demand.pk].queued) == (16, 1)
    assert (pools[spot.pk].held, pools[spot.pk].free) == (8, 8)
    assert 'data-testid="fleet-gpus">24 / 48<' in html
    tenants = {t["tenant__slug"]: t for t in page.context["tenants"]}
    assert (tenants["acme"]["running"], tenants["acme"]["gpus"]) == (1, 16)
    assert (tenants["globex"]["holding"], tenants["globex"]["queued"]) == (1, 1)
    assert page.context["queued_total"] == 1
    assert 'data-testid="fleet-revenue"' in html and "Revenue this month" in html


def test_the_fleet_is_for_staff_only(db):
    world = make_world("acme")
    assert signed_in_client(world.owner, world.tenant).get(FLEET).status_code in (403, 404)


def test_empty_fleet_says_so(db):
    html = staff().get(FLEET).content.decode()
    assert "No organisation has work running or queued." in html
    assert "Nothing is queued." in html


def test_reclaim_confirmation_lists_the_jobs_and_organisations_it_hits(db):
    on_demand, spot = gpu_pools()
    world = make_world("acme")
    job = JobFactory(
        tenant=world.tenant, name="llama-spot", pool=on_demand, spot_pool=spot, nodes=1,
        spot_nodes=1,
    )  # fmt: skip
    advance_to(job, JobStatus.RUNNING)

    page = staff().get(reverse("jobs:staff_sandbox_reclaim", args=[spot.pk]))

    details = page.context["details"]
    assert details == [f"llama-spot (#{job.pk}, Acme Corp): 1 spot node, running"]
    assert 'data-testid="confirm-details"' in page.content.decode()


def test_reactivate_is_not_a_danger_button(db):
    world = make_world("acme")
    page = staff().get(reverse("staff_tenant_reactivate", args=[world.tenant.slug]))
    html = page.content.decode()
    assert 'class="btn btn-primary">Reactivate<' in html
    assert "btn-danger" not in html.split("<main", 1)[-1]
