"""Volumes on the local backend: a folder per volume, bind-mounted into the job's sandbox
at its path (read-only where asked); what one job writes, the next reads; a full volume
refuses the start; deleting the volume deletes the folder."""

from __future__ import annotations

import os

import pytest

from jobs.backends.local import LocalBackend
from jobs.backends.local_sandbox import sandbox_support
from jobs.backends.local_volumes import volume_folder
from jobs.models import JobStatus
from jobs.services import job_dispatch, job_submit
from storage import services as storage
from tests.factories import VolumeFactory
from tests.jobs.test_local_lifecycle import spec, wait_for_status
from tests.jobs_helpers import launch

if not sandbox_support().available and not os.environ.get("CI"):
    pytest.skip(f"no host sandbox here: {sandbox_support().reason}", allow_module_level=True)

pytestmark = pytest.mark.django_db(transaction=True)

ENDED = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}


def output(job) -> list[str]:
    return [line.text for line in LocalBackend().logs(job)]


def run(world, program: str, volumes: list[dict]):
    job = launch(world, spec(["python", "-c", program], volumes=volumes))
    return wait_for_status(job, ENDED, timeout=30)


def test_data_written_by_one_job_is_read_by_the_next(world, catalog):
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    writer = run(
        world,
        "import pathlib; pathlib.Path('/data/model.txt').write_text('epoch 3')",
        [{"name": "data", "path": "/data"}],
    )
    assert writer.status == JobStatus.SUCCEEDED, (writer.status_reason, output(writer))
    folder = volume_folder(tenant_id=world.tenant.pk, volume_id=volume.pk)
    assert (folder / "model.txt").read_text() == "epoch 3"
    reader = run(
        world,
        "print(open('/mnt/in/model.txt').read())\n"
        "try:\n    open('/mnt/in/other.txt', 'w')\n"
        "except OSError as e:\n    print('read-only', e.errno)",
        [{"name": "data", "path": "/mnt/in", "read_only": True}],
    )
    assert reader.status == JobStatus.SUCCEEDED, (reader.status_reason, output(reader))
    assert output(reader) == ["epoch 3", "read-only 30"]  # EROFS
    # A later job of the organisation may change what an earlier one wrote.
    appender = run(
        world,
        "open('/data/model.txt', 'a').write(' + 4')",
        [{"name": "data", "path": "/data"}],
    )
    assert appender.status == JobStatus.SUCCEEDED, (appender.status_reason, output(appender))
    assert (folder / "model.txt").read_text() == "epoch 3 + 4"
    # Deleting the volume deletes its folder.
    storage.volume_delete(volume=volume, user=world.owner)
    assert not folder.exists()


def test_a_volume_another_tenant_cant_reach_and_a_job_without_it_doesnt_see(
    world, other_world, catalog
):
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    run(world, "open('/data/secret.txt', 'w').write('x')", [{"name": "data", "path": "/data"}])
    folder = volume_folder(tenant_id=world.tenant.pk, volume_id=volume.pk)
    probe = launch(
        other_world,
        spec(["python", "-c", f"import os; print(os.path.exists({str(folder)!r}))"]),
    )
    probe = wait_for_status(probe, ENDED, timeout=30)
    assert output(probe) == ["False"]


def test_a_full_volume_refuses_the_start_saying_so(world, catalog):
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    empty = run(world, "print('ok')", [{"name": "data", "path": "/data"}])
    assert empty.status == JobStatus.SUCCEEDED
    # Fill it from the host (blocks allocated, not written: the size check counts blocks).
    folder = volume_folder(tenant_id=world.tenant.pk, volume_id=volume.pk)
    with open(folder / "big", "wb") as big:
        os.posix_fallocate(big.fileno(), 0, 1 << 30)
    job = job_submit(tenant=world.tenant, user=world.member, spec=spec(
        ["python", "-c", "print('never')"], volumes=[{"name": "data", "path": "/data"}]
    ))  # fmt: skip
    job = job_dispatch(job=job)
    assert job.status == JobStatus.FAILED
    assert "volume data is full" in job.status_reason and "1 GiB" in job.status_reason
