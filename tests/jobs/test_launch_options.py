"""The launch form's choices (jobs.launch_options.launch_choices) and the form that offers
and accepts them: only GPU type × region × tier combinations that pools have, the GPUs
per node their nodes have, images that run on the hardware; and the launch's placement
agreeing with them (the same `launch_pools`).

The demo catalog with every demo pool launchable (COMPUTE_BACKENDS local + kubernetes):
us-west has A100-80GB on-demand and spot, H200 on-demand only, L40S (4 GPUs a node) spot
only; us-east has L4 on-demand only; eu-central has A100-80GB on spot only; "This host"
is the test host's CPU pool."""

from __future__ import annotations

from decimal import Decimal

import pytest

from console.service_errors import ServiceError
from jobs.forms import LaunchForm
from jobs.launch_options import launch_choices, made_for
from jobs.models import JobStatus, Priority
from jobs.services import JobSpec, job_submit
from jobs.services.spec import spec_validate
from marketplace.models import Tier
from tests.factories import ImageFactory


@pytest.fixture
def launchable(catalog, settings):
    settings.COMPUTE_BACKENDS = ["local", "kubernetes"]
    return catalog


def choose(world, **asked):
    values = {"gpu_type": None, "region": None}
    values.update(asked)
    return launch_choices(tenant=world.tenant, **values)


def slugs(items) -> list[str]:
    return [item.slug for item in items]


def test_regions_are_those_with_the_gpu_type_and_a_missing_one_is_replaced(world, launchable):
    l4 = choose(world, gpu_type="l4", region="us-west", gpus_per_node="4")
    assert slugs(l4.regions) == ["us-east"]
    assert l4.region.slug == "us-east"
    assert l4.notes == ["L4 24GB is not offered in US West (Oregon): US East (Virginia) chosen."]

    a100 = choose(world, gpu_type="a100-80gb", region="us-west")
    # us-east sells A100-80GB only as reserved capacity: nothing a launch can be placed on.
    assert set(slugs(a100.regions)) == {"us-west", "eu-central"}
    assert (a100.region.slug, a100.tiers, a100.notes) == (
        "us-west",
        [Tier.ON_DEMAND, Tier.SPOT],
        [],
    )


def test_gpu_types_are_only_those_some_pool_can_launch(world, launchable, settings):
    offered = set(slugs(choose(world).gpu_types))
    assert {"a100-80gb", "h100-80gb", "l4", "l40s", "mi300x"} <= offered
    assert choose(world).cpu_offered

    settings.COMPUTE_BACKENDS = ["local"]  # the test host has no GPUs
    local_only = choose(world, gpu_type="a100-80gb")
    assert local_only.gpu_types == [] and local_only.gpu_type is None
    assert local_only.notes == ["A100 80GB SXM is not offered for launch here."]
    assert slugs(local_only.regions) == ["local"]


def test_choosing_a_gpu_type_sets_a_whole_node_never_zero(world, launchable):
    cpu = choose(world)
    assert (cpu.gpus_per_node_choices, cpu.gpus_per_node) == ([0], 0)

    a100 = choose(world, gpu_type="a100-80gb", region="us-west", gpus_per_node="0")
    assert a100.gpus_per_node_choices == list(range(1, 9))
    assert a100.gpus_per_node == 8 and a100.notes == []
    assert choose(world, gpu_type="a100-80gb", gpus_per_node="2").gpus_per_node == 2

    l40s = choose(world, gpu_type="l40s", region="us-west", gpus_per_node="8", spot_ratio="1")
    assert (l40s.gpus_per_node_choices, l40s.gpus_per_node) == ([1, 2, 3, 4], 4)
    assert l40s.notes == ["The nodes here have 4 GPUs: 4 per node chosen."]


@pytest.mark.parametrize(
    ("gpu_type", "region", "asked", "nodes", "resolved", "note"),
    [
        ("a100-80gb", "eu-central", "0", 1, Decimal(1), "spot only: spot ratio set to 1"),
        ("h200-141gb", "us-west", "0.5", 2, Decimal(0), "on-demand only: spot ratio set to 0"),
        ("a100-80gb", "us-west", "0.7", 3, Decimal("0.7"), ""),
        # 0.2 of 2 nodes rounds to no spot node: on-demand only is honoured as it is.
        ("h200-141gb", "us-west", "0.2", 2, Decimal("0.2"), ""),
    ],
)
def test_the_spot_ratio_follows_the_tiers_offered(
    world, launchable, gpu_type, region, asked, nodes, resolved, note
):
    choices = choose(world, gpu_type=gpu_type, region=region, spot_ratio=asked, nodes=str(nodes))
    assert choices.spot_ratio == resolved
    if note:
        assert len(choices.notes) == 1 and note in choices.notes[0]
    else:
        assert choices.notes == []


def test_the_image_follows_the_hardware(world, launchable):
    on_cpu = choose(world, image="python-3.11")
    assert on_cpu.image.slug == "python-3.11"
    assert all("cpu" in image.compatible_with for image in on_cpu.images)

    # Switching to a GPU: the CPU image runs there but isn't made for it.
    on_gpu = launch_choices(
        tenant=world.tenant, gpu_type="a100-80gb", region=None, image="python-3.11",
        switch_image=True,
    )  # fmt: skip
    assert on_gpu.image.slug != "python-3.11" and made_for(on_gpu.image, on_gpu.gpu_type)
    assert "python-3.11" in slugs(on_gpu.images)  # still offered, after those made for it
    assert slugs(on_gpu.images).index(on_gpu.image.slug) < slugs(on_gpu.images).index("python-3.11")
    # Not switching (a form submitted as it is): a runnable choice is the user's.
    kept = choose(world, gpu_type="a100-80gb", image="python-3.11")
    assert kept.image.slug == "python-3.11" and kept.notes == []

    # A framework image follows to the hardware's build of the same framework.
    on_amd = launch_choices(
        tenant=world.tenant, gpu_type="mi300x", region=None, image="pytorch-2-5-cuda12-4",
        switch_image=True,
    )  # fmt: skip
    assert on_amd.image.slug == "pytorch-rocm-6-2"
    assert on_amd.notes == [
        "PyTorch 2.5 · CUDA 12.4 doesn't run on Instinct MI300X 192GB: PyTorch 2.3 · ROCm 6.2 "
        "chosen."
    ]


def test_private_images_are_the_tenants_own(world, other_world, launchable):
    ImageFactory(tenant=other_world.tenant, slug="theirs", compatible_with=["cpu"])
    ImageFactory(tenant=world.tenant, slug="ours", compatible_with=["cpu"])
    offered = slugs(choose(world).images)
    assert "ours" in offered and "theirs" not in offered


def test_capacity_and_the_queue_it_would_join(world, launchable):
    def a100(name: str, nodes: int, priority: str = Priority.NORMAL):
        spec = JobSpec(name=name, image="cuda-12-4-runtime", command=["true"], nodes=nodes,
                       gpu_type="a100-80gb", gpus_per_node=8, region="us-west",
                       priority=priority)  # fmt: skip
        return job_submit(tenant=world.tenant, user=world.member, spec=spec)

    asked = {"gpu_type": "a100-80gb", "region": "us-west", "gpus_per_node": "8", "nodes": "1"}
    fresh = choose(world, **asked)
    (pool,) = fresh.capacity
    assert (pool.tier, pool.load.capacity, pool.load.free, pool.asked) == (
        Tier.ON_DEMAND,
        32,
        32,
        8,
    )
    assert fresh.fits_now and fresh.queued_ahead == 0

    assert a100("holder", nodes=3).status == JobStatus.DISPATCHING  # holds 24 of 32
    assert a100("waiting", nodes=2).status == JobStatus.QUEUED
    busy = choose(world, **{**asked, "nodes": "2"})
    assert (busy.capacity[0].load.free, busy.capacity[0].asked) == (8, 16)
    assert not busy.fits_now and busy.queued_ahead == 1
    # A critical launch goes before the normal one that waits.
    assert choose(world, **asked, priority=Priority.CRITICAL).queued_ahead == 0

    # A 70/30 split of 3 nodes lands on both pools; each says what it has.
    mixed = choose(world, **{**asked, "nodes": "3", "spot_ratio": "0.7"})
    assert [(c.tier, c.nodes, c.asked) for c in mixed.capacity] == [
        (Tier.ON_DEMAND, 1, 8), (Tier.SPOT, 2, 16),
    ]  # fmt: skip
    assert mixed.split.label == "2 spot + 1 on-demand nodes"


def test_every_offered_combination_launches_and_others_are_refused(world, launchable):
    """The form offers what spec_validate accepts: one rule (launch_pools) for both."""
    everything = choose(world)
    hardware = [None, *everything.gpu_types]
    checked = 0
    for gpu in hardware:
        slug = gpu.slug if gpu else None
        for region in choose(world, gpu_type=slug).regions:
            base = choose(world, gpu_type=slug, region=region.slug)
            for tier in base.tiers:
                ratio = "1" if tier == Tier.SPOT else "0"
                choices = choose(world, gpu_type=slug, region=region.slug, spot_ratio=ratio)
                assert choices.notes == [], choices.notes
                spec = JobSpec(name="x", image=choices.image.slug, command=["true"],
                               gpu_type=slug, gpus_per_node=choices.gpus_per_node,
                               region=region.slug, spot_ratio=Decimal(ratio))  # fmt: skip
                resolved = spec_validate(tenant=world.tenant, spec=spec)
                placed = resolved.placement.spot_pool or resolved.placement.pool
                assert (placed.region_id, placed.tier) == (region.pk, tier)
                checked += 1
    assert checked >= 15
    not_offered = JobSpec(name="x", image="cuda-12-4-runtime", command=["true"],
                          gpu_type="l4", gpus_per_node=4, region="us-west")  # fmt: skip
    with pytest.raises(ServiceError, match="No on-demand l4 pool in us-west"):
        spec_validate(tenant=world.tenant, spec=not_offered)


# --- the form --------------------------------------------------------------------------------


def form_data(**overrides) -> dict:
    data = {
        "name": "x", "gpu_type": "a100-80gb", "gpus_per_node": "8", "cpus": "8", "nodes": "1",
        "region": "us-west", "spot_ratio": "0", "image": "cuda-12-4-runtime",
        "command": "python train.py", "priority": "normal", "max_runtime_minutes": "60",
    }  # fmt: skip
    data.update(overrides)
    return data


def test_the_form_accepts_a_combination_that_exists(world, launchable):
    form = LaunchForm(form_data(), tenant=world.tenant)
    assert form.is_valid(), form.errors
    form = LaunchForm(
        form_data(gpu_type="l4", region="us-east", gpus_per_node="3"), tenant=world.tenant
    )
    assert form.is_valid(), form.errors


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"gpu_type": "l4"}, "region",
         "No L4 24GB pool in US West (Oregon) on this installation's backends; L4 24GB is "
         "offered in: US East (Virginia)."),
        ({"region": "eu-central"}, "spot_ratio",
         "A100 80GB SXM in EU Central (Frankfurt) is spot only: the spot ratio must be 1."),
        ({"gpu_type": "h200-141gb", "spot_ratio": "1"}, "spot_ratio",
         "H200 141GB SXM in US West (Oregon) is on-demand only: the spot ratio must be 0."),
        ({"gpu_type": "l40s", "spot_ratio": "1"}, "gpus_per_node",
         "Nodes of L40S 48GB in US West (Oregon) have 4 GPUs: choose 1 to 4."),
        ({"gpus_per_node": "0"}, "gpus_per_node", "A GPU job needs at least one GPU per node."),
    ],
    ids=["region-without-it", "spot-only", "on-demand-only", "gpus-over-the-node", "no-gpus"],
)  # fmt: skip
def test_the_form_refuses_what_does_not_exist_with_a_clear_error(
    world, launchable, overrides, field, message
):
    form = LaunchForm(form_data(**overrides), tenant=world.tenant)
    assert not form.is_valid()
    assert form.errors[field] == [message]


def test_the_form_refuses_cpu_where_no_cpu_pool_is(world, launchable, settings):
    settings.COMPUTE_BACKENDS = ["kubernetes"]  # the demo's CPU pools: us-west, us-east, eu
    form = LaunchForm(
        form_data(gpu_type="", gpus_per_node="0", region="local", image="python-3.11"),
        tenant=world.tenant,
    )
    assert not form.is_valid()
    assert "No CPU pool in This host" in form.errors["region"][0]
