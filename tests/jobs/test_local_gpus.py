"""GPU assignment of the local backend: exclusive devices per job through
CUDA_VISIBLE_DEVICES. NVML is the edge we can't run here (no GPU on this machine), so its
device list is simulated; admission, dispatch, the supervisor and the real processes are
the code under test."""

from __future__ import annotations

import pytest

from jobs import services, tasks
from jobs.actors import SYSTEM
from jobs.backends import local
from jobs.backends.local import LocalBackend
from jobs.models import JobStatus
from marketplace.services import capacity_sync
from tests.jobs.test_local_lifecycle import spec, wait_for_status

H100 = "NVIDIA H100 80GB HBM3"
PRINT_DEVICES = [
    "python",
    "-c",
    "import os, time; print('devices=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True);"
    " time.sleep(60)",
]


@pytest.fixture
def four_h100s(catalog, monkeypatch):
    """This host as if NVML listed four H100s (indices 0–3), synced into the local pool."""
    monkeypatch.setattr(local, "nvml_devices", lambda: [(index, H100) for index in range(4)])
    capacity_sync(backend=LocalBackend())


def gpu_job(world, gpus: int):
    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=spec(PRINT_DEVICES, gpu_type="h100-80gb", gpus_per_node=gpus, region="local"),
    )
    if job.status == JobStatus.DISPATCHING:
        job = services.job_dispatch(job=job)
    return job


def cancel(job) -> None:
    """The cancel, and its task (no worker runs here): the process is told to stop."""
    services.job_cancel(job=job, actor=SYSTEM)
    tasks.job_cancel_task(job.pk)


def printed_devices(job) -> set[int]:
    backend = LocalBackend()
    for _ in range(100):
        lines = [line.text for line in backend.logs(job)]
        if lines:
            return {int(i) for i in lines[0].removeprefix("devices=").split(",")}
        wait_for_status(job, {JobStatus.RUNNING}, timeout=0.1)
    raise AssertionError(f"job {job.pk} printed nothing")


@pytest.mark.django_db(transaction=True)
def test_jobs_get_disjoint_gpus_and_a_waiting_job_gets_the_freed_ones(world, four_h100s):
    first = wait_for_status(gpu_job(world, 2), {JobStatus.RUNNING})
    second = wait_for_status(gpu_job(world, 2), {JobStatus.RUNNING})
    try:
        first_devices, second_devices = printed_devices(first), printed_devices(second)
        assert len(first_devices) == len(second_devices) == 2
        assert first_devices.isdisjoint(second_devices)
        assert first_devices | second_devices == {0, 1, 2, 3}
        assert set(first.assigned_devices) == first_devices

        # All four are taken: the next GPU job waits, saying why, instead of sharing one.
        third = gpu_job(world, 1)
        assert third.status == JobStatus.QUEUED and third.status_reason

        cancel(first)
        # Its devices stay its own until its process is seen gone (cancelling holds them).
        third.refresh_from_db()
        assert first.status == JobStatus.CANCELLING and third.status == JobStatus.QUEUED
        wait_for_status(first, {JobStatus.CANCELLED})
        third.refresh_from_db()
        if third.status == JobStatus.DISPATCHING:
            services.job_dispatch(job=third)
        third = wait_for_status(third, {JobStatus.RUNNING})
        assert printed_devices(third) <= first_devices
        cancel(third)
        wait_for_status(third, {JobStatus.CANCELLED})
    finally:
        cancel(second)
        wait_for_status(second, {JobStatus.CANCELLED})


def test_assign_devices_refuses_rather_than_share(catalog, four_h100s, world):
    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=spec(PRINT_DEVICES, gpu_type="h100-80gb", gpus_per_node=3, region="local"),
    )
    backend = LocalBackend()
    assert backend.assign_devices(job, busy={1}) == [0, 2, 3]
    with pytest.raises(local.BackendRejected, match="only 2 free h100-80gb"):
        backend.assign_devices(job, busy={0, 1})
