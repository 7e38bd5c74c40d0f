"""The `memory_margin` knob (issue 31): a job that declares the GPU memory it needs per
GPU (`gpu_memory_gib`) runs only in pools whose GPU type fits that need with the pool's
margin kept free. Launch refuses a pool that can't (400 on the field, saying the sums);
admission holds a queued job when staff raised the margin since, and lets it go when the
margin comes back down."""

from __future__ import annotations

from decimal import Decimal

import pytest

from console.service_errors import ServiceError
from jobs import services
from jobs.models import Job, JobStatus
from jobs.services import job_clone
from marketplace.models import NodePool
from tests.jobs.test_preemption import _no_quotas, gpu_job, h100  # noqa: F401
from tests.jobs_helpers import advance_to, submit

pytestmark = pytest.mark.django_db


def test_the_need_plus_the_margin_must_fit_one_gpu(world, h100):  # noqa: F811
    _no_quotas(world)
    # 66 GiB × 1.2 = 79.2 GiB: fits an 80 GiB H100.
    fits = gpu_job(world, "fits", gpus=1, gpu_memory_gib=66)
    assert fits.status == JobStatus.DISPATCHING and fits.gpu_memory_gib == 66
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, "too-big", gpus=1, gpu_memory_gib=67)  # 80.4 GiB
    assert refused.value.field == "gpu_memory_gib"
    assert refused.value.message == (
        "67 GiB per GPU with t-h100's 20% memory margin is 80.4 GiB; its H100 80GB SXM GPUs "
        "have 80 GiB each. "
        "Pick a GPU type with more memory."
    )
    assert not Job.objects.filter(name="too-big").exists()
    # Staff may keep less in reserve: the same need then fits.
    NodePool.objects.filter(pk=h100.pk).update(memory_margin=Decimal(0))
    assert gpu_job(world, "no-margin", gpus=1, gpu_memory_gib=80).status == (JobStatus.DISPATCHING)
    # Not declared: not checked.
    assert gpu_job(world, "undeclared", gpus=1).gpu_memory_gib is None


@pytest.mark.parametrize("value", [0, -1, 4097, True, "40", 40.5])
def test_a_need_is_a_whole_number_of_gib(world, h100, value):  # noqa: F811
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, "bad", gpus=1, gpu_memory_gib=value)
    assert refused.value.field == "gpu_memory_gib"
    assert "whole number of GiB" in refused.value.message


def test_a_cpu_job_declares_no_gpu_memory(world, catalog):
    with pytest.raises(ServiceError) as refused:
        submit(world, "cpu", gpu_memory_gib=8)
    assert refused.value.field == "gpu_memory_gib"


def test_a_queued_job_waits_while_the_raised_margin_leaves_it_no_room(world, h100):  # noqa: F811
    _no_quotas(world)
    holder = gpu_job(world, "holder", gpus=8)
    advance_to(holder, JobStatus.RUNNING)
    waiting = gpu_job(world, "waiting", gpus=1, gpu_memory_gib=60)
    assert waiting.status == JobStatus.QUEUED
    # Staff raise the margin: 60 × 1.5 = 90 GiB no longer fits; freed GPUs don't help.
    NodePool.objects.filter(pk=h100.pk).update(memory_margin=Decimal("0.5"))
    advance_to(holder, JobStatus.SUCCEEDED)
    services.jobs_admit(pools=[h100.pk])
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.QUEUED
    assert waiting.status_reason == (
        "60 GiB per GPU with t-h100's 50% memory margin is 90 GiB; its H100 80GB SXM GPUs "
        "have 80 GiB each."
    )
    NodePool.objects.filter(pk=h100.pk).update(memory_margin=Decimal("0.25"))  # 75 GiB
    services.jobs_admit(pools=[h100.pk])
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.DISPATCHING


def test_a_clone_keeps_the_declared_need(world, h100):  # noqa: F811
    _no_quotas(world)
    job = gpu_job(world, "original", gpus=1, gpu_memory_gib=40)
    assert job_clone(job=job, user=world.member).gpu_memory_gib == 40


def test_the_api_takes_and_shows_the_need(world, h100, owner_api):  # noqa: F811
    _no_quotas(world)
    spec = {
        "name": "api",
        "image": "cuda-12-4-runtime",
        "command": ["python", "-c", "pass"],
        "gpu_type": "h100-80gb",
        "gpus_per_node": 1,
        "region": "local",
    }
    made = owner_api.post("/api/v1/jobs", {**spec, "gpu_memory_gib": 60}, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["gpu_memory_gib"] == 60
    assert owner_api.get(f"/api/v1/jobs/{made.json()['id']}").json()["gpu_memory_gib"] == 60
    refused = owner_api.post("/api/v1/jobs", {**spec, "gpu_memory_gib": 70}, format="json")
    assert refused.status_code == 400
    assert "memory margin" in refused.json()["gpu_memory_gib"][0]
    wrong = owner_api.post("/api/v1/jobs", {**spec, "gpu_memory_gib": "lots"}, format="json")
    assert wrong.status_code == 400 and "gpu_memory_gib" in wrong.json()
