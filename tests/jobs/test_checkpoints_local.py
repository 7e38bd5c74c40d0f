"""A local job and the folder store, for real: the job writes a checkpoint in the
protocol's format into GPUGEEK_CHECKPOINT_URL, is paused and resumed, and the resumed
start is told GPUGEEK_RESUME_FROM and reads it. In the bubblewrap sandbox only the
job's own prefix is mounted: the store's other folders don't exist there."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from jobs import services
from jobs.actors import SYSTEM
from jobs.backends import local_sandbox
from jobs.backends.local import LocalBackend
from jobs.checkpoints.store import MANIFEST_NAME, checkpoint_store
from jobs.models import Job, JobResume, JobStatus
from jobs.services import JobSpec
from jobs.services.checkpoints import job_store_prefix
from tests.conftest import token_client
from tests.jobs.test_local_lifecycle import wait_for_status
from tests.jobs_helpers import launch

PROGRAM = """
import datetime, json, os, pathlib, signal, sys, time
url = os.environ["GPUGEEK_CHECKPOINT_URL"]
resume = os.environ["GPUGEEK_RESUME_FROM"]
base = pathlib.Path(url[len("file://"):])
if resume:
    manifest = json.loads(pathlib.Path(resume[len("file://"):]).read_text())
    folder = pathlib.Path(resume[len("file://"):]).parent
    print("resumed at", manifest["step"], (folder / "w.bin").read_text(), flush=True)
else:
    step = base / "5"
    step.mkdir(parents=True, exist_ok=True)
    (step / "w.bin").write_text("weights")
    (step / "gpugeek-checkpoint.json").write_text(json.dumps({
        "step": 5, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "files": [{"path": "w.bin", "size": 7}]}))
    print("saved", flush=True)
print("store visible:", os.path.exists(sys.argv[1]), flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
time.sleep(60)
"""


def wait_for_line(job, prefix: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in LocalBackend().logs(job):
            if line.text.startswith(prefix):
                return line.text
        time.sleep(0.1)
    raise AssertionError([line.text for line in LocalBackend().logs(job)])


@pytest.mark.django_db(transaction=True)
def test_a_resumed_local_job_reads_its_checkpoint_and_sees_only_its_prefix(
    world, catalog, settings
):
    settings.JOB_TERMINATION_GRACE_SECONDS = 1
    store = checkpoint_store()
    root = store.local_folder("")
    assert root is not None
    shutil.rmtree(root, ignore_errors=True)  # ids repeat across this session's databases
    (root / "999999" / "1" / "5").mkdir(parents=True)  # another tenant's job
    command = ["python", "-c", PROGRAM, str(root / "999999")]
    job = launch(world, JobSpec(name="ckpt", image="python-3.11", command=command, cpus=1))
    job = wait_for_status(job, {JobStatus.RUNNING})
    assert wait_for_line(job, "saved") == "saved"
    sandboxed = local_sandbox.sandbox_support().available
    visible = wait_for_line(job, "store visible:")
    assert visible == f"store visible: {not sandboxed}"
    [checkpoint] = store.checkpoints(job_store_prefix(job))
    assert checkpoint.step == 5

    job = services.job_pause(job=job, actor=SYSTEM)
    LocalBackend().suspend(job)
    job = wait_for_status(job, {JobStatus.PAUSED})
    job = services.job_resume(job=job, actor=SYSTEM)
    services.job_backend_resume(job=job)
    job = wait_for_status(job, {JobStatus.RUNNING})
    assert wait_for_line(job, "resumed at") == "resumed at 5 weights"
    job.refresh_from_db()
    assert job.resume_from == f"5/{MANIFEST_NAME}"
    resume = JobResume.objects.get(job=job)
    assert (resume.attempt, resume.start, resume.step) == (1, 1, 5)
    job = services.job_cancel(job=job, actor=SYSTEM)
    LocalBackend().cancel(job)
    wait_for_status(job, {JobStatus.CANCELLED})


CLONE_PROGRAM = """
import os, pathlib
resume = os.environ["GPUGEEK_RESUME_FROM"]
print("resumed", os.environ["GPUGEEK_RESUMED"], flush=True)
if resume:
    folder = pathlib.Path(resume[len("file://"):]).parent
    print("weights", (folder / "w.bin").read_text(), flush=True)
"""


@pytest.mark.django_db(transaction=True)
def test_clone_from_checkpoint_starts_from_a_copy_in_its_own_prefix(world, catalog):
    store = checkpoint_store()
    root = store.local_folder("")
    shutil.rmtree(root, ignore_errors=True)
    api = token_client(world.member, world.tenant)
    command = ["python", "-c", CLONE_PROGRAM]
    source = launch(world, JobSpec(name="src", image="python-3.11", command=command, cpus=1))
    wait_for_status(source, {JobStatus.SUCCEEDED})
    refused = api.post(f"/api/v1/jobs/{source.pk}/clone", {"from_checkpoint": True}, format="json")
    assert refused.status_code == 409, refused.content
    assert "no complete checkpoint" in refused.json()["detail"]

    folder = store.local_folder(job_store_prefix(source))
    (folder / "8").mkdir(parents=True)
    (folder / "8" / "w.bin").write_text("trained")
    manifest = {
        "step": 8,
        "time": "2026-01-01T00:00:00+00:00",
        "files": [{"path": "w.bin", "size": 7}],
    }
    (folder / "8" / MANIFEST_NAME).write_text(json.dumps(manifest))
    cloned = api.post(f"/api/v1/jobs/{source.pk}/clone", {"from_checkpoint": True}, format="json")
    assert cloned.status_code == 201, cloned.content
    clone = Job.objects.get(pk=cloned.json()["id"])
    assert clone.checkpoint_source_id == source.pk
    clone = services.job_dispatch(job=clone)
    clone = wait_for_status(clone, {JobStatus.SUCCEEDED})
    texts = [line.text for line in LocalBackend().logs(clone)]
    assert texts == ["resumed 1", "weights trained"]
    # The clone read a copy under its own prefix, never the source's.
    assert [c.step for c in store.checkpoints(job_store_prefix(clone))] == [8]
    resume = JobResume.objects.get(job=clone)
    assert (resume.attempt, resume.step, resume.lost_seconds) == (1, 8, None)
