"""Placement (issue 31): a job may require an interconnect or a CPU architecture, and
may accept several regions or GPU types; launch takes, of the places whose pools can
take it, the lowest hourly price divided by the pool's `locality_weight` in the job's
data region (its volumes' region, else `data_region`), and says so on its timeline.
A single region and GPU type is the one-candidate case and behaves as before."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from console.service_errors import ServiceError
from jobs.models import Job, JobEvent
from jobs.services import job_clone
from marketplace.models import NodePool, TenantQuota
from tests.conftest import signed_in_client, token_client
from tests.factories import (
    GpuTypeFactory,
    ImageFactory,
    NodePoolFactory,
    PriceEntryFactory,
    PriceVersionFactory,
    RegionFactory,
    VolumeFactory,
)
from tests.jobs_helpers import submit

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs"


class Place:
    """Two regions with the same GPU type: `near` (where the data is) and `far`, priced
    per GPU-hour as each test sets them."""

    def __init__(self):
        self.near, self.far = RegionFactory(slug="near"), RegionFactory(slug="far")
        self.gpu = GpuTypeFactory(slug="g1", model="G1 80GB")
        self.version = PriceVersionFactory()
        self.near_pool = self.pool(self.near)
        self.far_pool = self.pool(self.far)
        self.near_price = self.price(self.near, "2.80")
        self.far_price = self.price(self.far, "2.00")

    def pool(self, region, **fields) -> NodePool:
        values = {"region": region, "gpu_type": self.gpu, "node_count": 2}
        return NodePoolFactory(**(values | fields))

    def price(self, region, amount: str, gpu=None):
        return PriceEntryFactory(
            version=self.version, region=region, gpu_type=gpu or self.gpu,
            on_demand_price=Decimal(amount),
        )  # fmt: skip

    def set_price(self, region, amount: str) -> None:
        entry = self.near_price if region == self.near else self.far_price
        entry.on_demand_price = Decimal(amount)
        entry.save()


@pytest.fixture
def place(world, settings) -> Place:
    settings.COMPUTE_BACKENDS = ["local"]
    ImageFactory(slug="cuda-12-4-runtime", compatible_with=["nvidia"])
    # New organisations get a default quota; these tests are about placement.
    TenantQuota.objects.filter(tenant=world.tenant).delete()
    return Place()


def gpu_job(world, name="job", **spec):
    values = {"gpu_type": "g1", "gpus_per_node": 1, "cpus": None, "image": "cuda-12-4-runtime"}
    return submit(world, name, **(values | spec))


def placement_notes(job) -> list[str]:
    reasons = JobEvent.objects.filter(job=job).values_list("reason", flat=True)
    return [reason for reason in reasons if reason.startswith("Placement")]


# --- requirements ------------------------------------------------------------------------


def test_a_required_interconnect_picks_the_pool_that_has_it_over_a_larger_one(world, place):
    large = place.far_pool
    nvlink = place.pool(place.far, slug="far-nvlink", node_count=1, interconnects=["nvlink"])
    assert gpu_job(world, "any", region="far").pool == large  # the largest, as before
    job = gpu_job(world, "linked", region="far", requirements={"interconnect": "nvlink"})
    assert job.pool == nvlink
    assert job.requirements == {"interconnect": "nvlink"}


def test_a_requirement_no_pool_has_is_refused_saying_what_each_lacks(world, place):
    place.pool(place.far, slug="far-nvlink", node_count=1, interconnects=["nvlink"])
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, region="far", requirements={"interconnect": "rdma"})
    assert refused.value.field == "requirements"
    assert refused.value.message == (
        "No on-demand g1 pool in far has what this job requires: "  # pools by name
        "far-nvlink has no rdma interconnect (it has nvlink). "
        f"{place.far_pool.name} has no rdma interconnect (it has none)."
    )


def test_a_cpu_architecture_is_required_the_same_way(world, place):
    NodePool.objects.filter(pk=place.far_pool.pk).update(cpu_arch="amd64")
    arm = place.pool(place.far, slug="far-arm", node_count=1, cpu_arch="arm64")
    assert gpu_job(world, region="far", requirements={"cpu_arch": "arm64"}).pool == arm


@pytest.mark.parametrize(
    "requirements",
    [{"interconnect": "token-ring"}, {"cpu_arch": "sparc"}, {"gpu": "h100"}, ["nvlink"]],
)
def test_requirements_are_the_documented_values(world, place, requirements):
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, region="far", requirements=requirements)
    assert refused.value.field == "requirements"


def test_through_the_api_none_with_rdma_is_a_400_naming_requirements(world, place):
    api = token_client(world.member, world.tenant)
    body = {"name": "r", "image": "cuda-12-4-runtime", "command": ["true"], "gpu_type": "g1",
            "gpus_per_node": 1, "region": "far"}  # fmt: skip
    refused = api.post(JOBS, {**body, "requirements": {"interconnect": "rdma"}}, format="json")
    assert refused.status_code == 400, refused.content
    assert "has no rdma interconnect" in refused.json()["requirements"][0]
    bad = api.post(JOBS, {**body, "requirements": {"interconnect": "wifi"}}, format="json")
    assert bad.status_code == 400 and "requirements" in bad.json()
    NodePool.objects.filter(pk=place.far_pool.pk).update(interconnects=["rdma", "nvlink"])
    made = api.post(JOBS, {**body, "requirements": {"interconnect": "rdma"}}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["requirements"] == {"interconnect": "rdma"}


def test_a_clone_keeps_the_requirements(world, place):
    NodePool.objects.filter(pk=place.far_pool.pk).update(interconnects=["nvlink"])
    source = gpu_job(world, region="far", requirements={"interconnect": "nvlink"})
    clone = job_clone(job=source, user=world.member)
    assert clone.requirements == {"interconnect": "nvlink"}
    assert (clone.region, clone.pool) == (source.region, source.pool)


# --- several acceptable places, weighted by locality ----------------------------------------


def test_the_data_region_wins_while_the_other_is_less_than_its_weight_cheaper(world, place):
    # 2.80 ÷ 1.50 = 1.87 in the data region against 2.00 away: near wins.
    job = gpu_job(world, "near", regions=["near", "far"], data_region="near")
    assert (job.region, job.pool) == (place.near, place.near_pool)
    assert placement_notes(job) == [
        "Placement (data in near; lowest price ÷ locality weight wins): "
        "g1 in near: 2.80 USD/h ÷ locality 1.50 = 1.87; g1 in far: 2.00 USD/h. "
        "Chosen: g1 in near."
    ]
    # Much cheaper away (2.80 is 1.87× 1.50): far wins.
    place.set_price(place.far, "1.50")
    job = gpu_job(world, "far", regions=["near", "far"], data_region="near")
    assert job.region == place.far
    assert placement_notes(job)[0].endswith("Chosen: g1 in far.")


def test_weight_one_is_price_alone(world, place):
    NodePool.objects.filter(pk=place.near_pool.pk).update(locality_weight=Decimal(1))
    job = gpu_job(world, regions=["near", "far"], data_region="near")
    assert job.region == place.far
    assert "g1 in near: 2.80 USD/h." in placement_notes(job)[0]  # no locality factor


def test_without_a_data_region_the_cheapest_wins_and_ties_go_to_the_most_free(world, place):
    assert gpu_job(world, "cheap", regions=["near", "far"]).region == place.far
    place.set_price(place.far, "2.80")
    NodePool.objects.filter(pk=place.far_pool.pk).update(allocatable_gpus=8)  # near has 16
    assert gpu_job(world, "tie", regions=["near", "far"]).region == place.near


def test_several_gpu_types_and_the_places_that_cannot_take_it(world, place):
    small = GpuTypeFactory(slug="g2", model="G2 24GB", memory_gib=24)
    place.pool(place.near, gpu_type=small)
    place.price(place.near, "0.50", gpu=small)
    job = gpu_job(world, gpu_type=None, gpu_types=["g1", "g2"], regions=["near", "far"])
    assert job.gpu_type == small  # the cheapest
    # 40 GiB doesn't fit a 24 GiB G2 with its margin: that place is refused, said why.
    job = gpu_job(world, gpu_type=None, gpu_types=["g1", "g2"], region="near",
                  gpu_memory_gib=40)  # fmt: skip
    assert job.gpu_type == place.gpu
    (note,) = placement_notes(job)
    assert "g2 in near: refused (40 GiB per GPU with" in note
    assert note.endswith("Chosen: g1 in near.")


def test_when_no_acceptable_place_can_take_it_each_says_why(world, place):
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, regions=["near", "far"], gpus_per_node=9)
    assert refused.value.field == "gpus_per_node"
    assert refused.value.message == (
        "No acceptable region and GPU type can take this job. "
        f"g1 in near: {place.near_pool.name} has 8 GPUs per node; 9 asked. "
        f"g1 in far: {place.far_pool.name} has 8 GPUs per node; 9 asked."
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"region": "near", "regions": ["far"]}, "regions"),
        ({"gpu_types": ["g1"]}, "gpu_types"),  # with gpu_type g1
        ({"regions": ["near", "mars"]}, "regions"),
        ({"gpu_type": None, "gpu_types": ["g1", "tpu"]}, "gpu_types"),
        ({"regions": ["near"], "data_region": "mars"}, "data_region"),
        ({"regions": [f"r{n}" for n in range(9)]}, "regions"),
    ],
)
def test_the_lists_are_checked_on_their_field(world, place, spec, field):
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, **spec)
    assert refused.value.field == field


# --- volumes force their region --------------------------------------------------------------


def test_volumes_make_their_region_the_only_candidate(world, place):
    VolumeFactory(tenant=world.tenant, name="data", region=place.near)
    place.set_price(place.far, "0.10")  # far is much cheaper, but the data can't go there
    mounts = [{"name": "data", "path": "/data", "read_only": True}]
    job = gpu_job(world, regions=["near", "far"], volumes=mounts)
    assert job.region == place.near
    (note,) = placement_notes(job)
    assert note.startswith("Placement (data in near;")
    assert "g1 in far: refused (Its volumes are in near;" in note
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, regions=["near", "far"], volumes=mounts, data_region="far")
    assert refused.value.field == "data_region"


def test_volumes_outside_the_acceptable_regions_are_a_clear_error(world, place):
    elsewhere = RegionFactory(slug="elsewhere")
    place.pool(elsewhere)
    VolumeFactory(tenant=world.tenant, name="data", region=elsewhere)
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, regions=["near", "far"], volumes=[{"name": "data", "path": "/data"}])
    assert refused.value.field == "volumes"
    assert refused.value.message == (
        "Its volumes are in elsewhere, which is not among the acceptable regions (near, far): "
        "a volume can only be mounted in its own region."
    )


# --- one region: as before -------------------------------------------------------------------


def test_a_single_region_keeps_todays_behaviour(world, place):
    place.set_price(place.near, "0.10")  # cheaper, and where the data is: not asked for
    job = gpu_job(world, region="far", data_region="near")
    assert (job.region, job.pool) == (place.far, place.far_pool)
    assert placement_notes(job) == []
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, region="far", spot_ratio=Decimal(1))
    assert (refused.value.field, refused.value.message) == (
        "spot_ratio",
        "No spot g1 pool in far; lower the spot ratio.",
    )
    VolumeFactory(tenant=world.tenant, name="data", region=place.near)
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, region="far", volumes=[{"name": "data", "path": "/data"}])
    assert refused.value.message == (
        "Volume data is in near; this job runs in far. A volume is only usable in its region."
    )


# --- the launch form ---------------------------------------------------------------------------


def test_the_launch_form_takes_other_acceptable_places_and_requirements(world, place):
    NodePool.objects.filter(pk=place.near_pool.pk).update(interconnects=["nvlink"])
    member = signed_in_client(world.member, world.tenant)
    page = member.get(reverse("jobs:launch")).content.decode()
    assert 'name="regions"' in page and 'name="data_region"' in page
    form = {"name": "x", "gpu_type": "g1", "gpus_per_node": "1", "cpus": "1", "nodes": "1",
            "region": "far", "regions": ["near"], "data_region": "near", "spot_ratio": "0",
            "image": "cuda-12-4-runtime", "command": "python train.py", "priority": "normal",
            "max_runtime_minutes": "60", "interconnect": "nvlink"}  # fmt: skip
    response = member.post(reverse("jobs:launch"), form)
    assert response.status_code == 302, response.context["form"].errors
    job = Job.objects.get(name="x")
    assert (job.region, job.requirements) == (place.near, {"interconnect": "nvlink"})
    assert placement_notes(job)[0].endswith("Chosen: g1 in near.")
