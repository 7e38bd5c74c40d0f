"""The sandbox's simulated workload and the console's checkpoint store: given
GPUGEEK_CHECKPOINT_URL it writes checkpoints in the protocol the console reads, and a
resumed pod continues from the step in the manifest GPUGEEK_RESUME_FROM names (read
from the store, not from the simulator's memory)."""

from __future__ import annotations

from jobs.checkpoints.store import MANIFEST_NAME, FileCheckpointStore
from sandbox.workload import Workloads


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
