"""The sandbox's simulated workload and the console's checkpoint store: given
GPUGEEK_CHECKPOINT_URL it writes checkpoints in the protocol the console reads, and a
resumed pod continues from the step in the manifest GPUGEEK_RESUME_FROM names (read
from the store, not from the simulator's memory); rank 0 posts the job's `checkpoint`
event to the live console (uvicorn on the test database), which records the step."""

from __future__ import annotations

import pytest

from jobs.backends.local_checkpoints import checkpoint_environment
from jobs.checkpoints.store import MANIFEST_NAME, FileCheckpointStore
from jobs.models import Job, JobStatus
from sandbox.workload import Workloads
from tests.factories import JobFactory
from tests.jobs_helpers import advance_to
from tests.servers import asgi_server  # noqa: F401


def pod(uid: str, env: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
    return {
        "metadata": {
            "namespace": "gg-t-7",
            "name": f"gg-77-a1-{uid}",
            "uid": uid,
            "labels": {},
            "annotations": annotations or {},
        },
        "spec": {
            "containers": [
                {
                    "command": ["python", "train.py"],
                    "env": [{"name": name, "value": value} for name, value in env.items()],
                }
            ]
        },
    }


def test_the_workload_writes_complete_checkpoints_and_resumes_from_the_store(tmp_path):
    store = FileCheckpointStore(tmp_path)
    url = f"file://{tmp_path}/7/77/"
    env = {
        "GPUGEEK_JOB_ID": "77",
        "GPUGEEK_CHECKPOINT_URL": url,
        "SANDBOX_DURATION_SECONDS": "20",
        "SANDBOX_CHECKPOINT_SECONDS": "1",
    }
    run = Workloads(clock=lambda: 0.0).play(pod("first", env))
    lines = [line for elapsed in (1.0, 2.0, 3.0) for line in run.ticker(elapsed)]
    saved = [line for line in lines if line.startswith("saved checkpoint ")]
    assert len(saved) == 3 and all(url in line for line in saved)
    found = store.checkpoints("7/77/")
    assert len(found) == 3
    latest = found[-1]
    assert latest.step > 0 and {f.path for f in latest.files} == {"model.pt", "optimizer.pt"}

    manifest_url = f"{url}{latest.step}/{MANIFEST_NAME}"
    resumed_env = {**env, "GPUGEEK_RESUMED": "1", "GPUGEEK_RESUME_FROM": manifest_url}
    fresh_simulator = Workloads(clock=lambda: 0.0)  # nothing in memory: only the store
    resumed = fresh_simulator.play(pod("second", resumed_env))
    assert f"at step {latest.step}" in resumed.logs[-2]
    assert resumed.logs[-1] == f"GPUGEEK_RESUME_FROM={manifest_url}"


@pytest.fixture
def shared_store(tmp_path, monkeypatch, settings):
    """A folder store both this process and the console's server (started after) use."""
    url = f"file://{tmp_path / 'store'}"
    monkeypatch.setenv("CHECKPOINT_STORE_URL", url)
    settings.CHECKPOINT_STORE_URL = url
    return url


@pytest.mark.django_db(transaction=True)
def test_rank_0_posts_the_checkpoint_event_and_the_console_records_it(
    shared_store,
    asgi_server,  # noqa: F811
    settings,
):
    job = JobFactory()
    advance_to(job, JobStatus.RUNNING)
    settings.CONSOLE_URL_FOR_JOBS = asgi_server.url
    env = {
        **checkpoint_environment(job, sandboxed=False),  # what the job is handed
        "GPUGEEK_JOB_ID": str(job.pk),
        "SANDBOX_DURATION_SECONDS": "20",
        "SANDBOX_CHECKPOINT_SECONDS": "1",
    }
    assert env["GPUGEEK_CHECKPOINT_TOKEN"] and env["GPUGEEK_CHECKPOINT_NOTIFY_URL"]
    run = Workloads(clock=lambda: 0.0).play(pod("events", env))
    lines = list(run.ticker(1.0))
    saved = [line for line in lines if line.startswith("saved checkpoint ")]
    step = Job.objects.get(pk=job.pk).last_checkpoint_step
    # Recorded by the console on the event, before the tick returned (no scan ran).
    assert len(saved) == 1 and step is not None and f"/{step}/" in saved[0]
    assert f"checkpoint event: the console recorded step {step}" in lines
    # Another rank posts nothing; a pod can't post for another job (its token is its own).
    other = {**env, "JOB_COMPLETION_INDEX": "1"}
    lines = list(Workloads(clock=lambda: 0.0).play(pod("rank1", other)).ticker(1.0))
    assert lines and not any("checkpoint event" in line for line in lines)
    theirs = JobFactory()
    advance_to(theirs, JobStatus.RUNNING)
    forged = {
        **env,
        "GPUGEEK_CHECKPOINT_NOTIFY_URL": env["GPUGEEK_CHECKPOINT_NOTIFY_URL"].replace(
            f"/{job.pk}/", f"/{theirs.pk}/"
        ),
    }
    lines = list(Workloads(clock=lambda: 0.0).play(pod("forged", forged)).ticker(1.0))
    assert any("checkpoint event not taken (HTTP 404)" in line for line in lines)
    assert Job.objects.get(pk=theirs.pk).last_checkpoint_step is None
