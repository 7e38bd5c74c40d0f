"""Filling a volume that lives on a cluster: the console runs a copy Job in the tenant's
namespace with the volume's claim mounted (golden manifest), the sandbox runs its pod for
real (the console's `python -m storage.fill_pod`, with the pod's environment only) into
the folder it keeps for the claim, and the worker reports the copy's progress from the
pod's log, ends the fill as the copy ended, and removes the copy's objects. Driven through
the official Kubernetes client against the sandbox's API server."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs.backends import get_backend
from jobs.backends.kubernetes import manifests
from jobs.extensions import VolumeMount
from jobs.models import Job, JobStatus
from sandbox.workload import Workloads
from storage import services
from storage.models import FillStatus, VolumeFill
from tests.factories import VolumeFactory
from tests.jobs.test_kubernetes_lifecycle import (  # noqa: F401  (cluster: a fixture)
    cluster,
    gpu_spec,
    settle,
)
from tests.jobs.test_kubernetes_manifests import assert_golden, pinned_settings  # noqa: F401
from tests.jobs_helpers import launch

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOAD = b"weights " * 16_384  # 131,072 bytes
# Over the copy's 1 MiB read size, sent in pieces 50 ms apart (about 2.4 s): a test sees
# the copy under way.
SLOW_PAYLOAD = b"w" * (3 << 20)
CHUNK = 64 << 10


class Handler(BaseHTTPRequestHandler):
    """/model.bin: PAYLOAD; /slow.bin: SLOW_PAYLOAD, slowly; anything else 404."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path not in ("/model.bin", "/slow.bin"):
            self.send_response(404)
            self.end_headers()
            return
        slow = self.path == "/slow.bin"
        payload = SLOW_PAYLOAD if slow else PAYLOAD
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        for start in range(0, len(payload), CHUNK):
            try:
                self.wfile.write(payload[start : start + CHUNK])
                self.wfile.flush()
            except OSError:
                return  # the copy was stopped
            if slow:
                time.sleep(0.05)


@pytest.fixture(scope="module")
def http_base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def on_cluster(cluster, settings, tmp_path, monkeypatch):  # noqa: F811
    """The sandbox's kubelet runs fill pods into folders under tmp_path; the worker looks
    at the copy often."""
    settings.VOLUME_FILL_ALLOW_PRIVATE_HOSTS = True  # the test server is on 127.0.0.1
    workloads = Workloads(clock=time.monotonic, volume_root=tmp_path / "claims")
    cluster.pod_script = workloads.play
    monkeypatch.setattr(services, "CLUSTER_FILL_POLL_SECONDS", 0.1)
    return cluster


def claim_folder(tmp_path, volume):
    return tmp_path / "claims" / f"gg-t-{volume.tenant_id}" / f"gg-vol-{volume.pk}"


def fill_jobs(cluster) -> list[dict]:  # noqa: F811
    return [
        job
        for job in cluster.list("jobs")
        if manifests.FILL_LABEL in (job["metadata"].get("labels") or {})
    ]


def test_the_copy_job_matches_golden(pinned_settings):  # noqa: F811
    pinned_settings.VOLUME_FILL_IMAGE = "registry.example.com/gpugeek-console:1.4.0"
    pinned_settings.VOLUME_FILL_ALLOW_PRIVATE_HOSTS = False
    pinned_settings.VOLUME_FILL_S3_REGION = "us-east-1"
    mount = VolumeMount(
        volume_id=5, name="data", path="/volume", read_only=False, size_gib=100, shared=False
    )
    common = {"tenant_id": 7, "fill_id": 12, "attempt": 2}
    assert_golden(
        "kubernetes_volume_fill.json",
        {
            "job": manifests.volume_fill_job_manifest(
                mount=mount,
                source="s3://datasets/imagenet/",
                endpoint="https://minio.example.com",
                with_credential=True,
                **common,
            ),
            "secret": manifests.volume_fill_secret_manifest(
                volume_id=5, credential="tenant-key:tenant-secret", **common
            ),
        },
    )


def test_a_cluster_volume_is_filled_by_a_copy_pod_and_keeps_the_file(
    world, on_cluster, http_base, tmp_path
):
    volume = VolumeFactory(tenant=world.tenant, name="weights", region__slug="us-west")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/model.bin"
    )
    services.volume_fill_run(fill_id=fill.pk, attempt=0)
    fill.refresh_from_db()
    assert fill.status == FillStatus.SUCCEEDED, fill.error
    assert (fill.bytes_done, fill.files_done, fill.bytes_total) == (len(PAYLOAD), 1, len(PAYLOAD))
    # In the folder the sandbox keeps for the volume's claim, as a job mounting it sees.
    assert (claim_folder(tmp_path, volume) / "model.bin").read_bytes() == PAYLOAD
    claim = on_cluster.get("persistentvolumeclaims", f"gg-t-{volume.tenant_id}",
                           f"gg-vol-{volume.pk}")  # fmt: skip
    assert claim["status"]["phase"] == "Bound"
    assert fill_jobs(on_cluster) == []  # the copy's objects are removed once it ended


def test_a_failed_copy_says_why_from_the_pod(world, on_cluster, http_base, tmp_path):
    volume = VolumeFactory(tenant=world.tenant, name="missing", region__slug="us-west")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/no-such-file.bin"
    )
    services.volume_fill_run(fill_id=fill.pk, attempt=0)
    fill.refresh_from_db()
    assert fill.status == FillStatus.FAILED
    assert "404" in fill.error, fill.error
    assert not (claim_folder(tmp_path, volume) / "no-such-file.bin").exists()
    assert fill_jobs(on_cluster) == []


def test_a_cancel_stops_the_copy_pod_and_writes_nothing(world, on_cluster, http_base, tmp_path):
    volume = VolumeFactory(tenant=world.tenant, name="slow", region__slug="us-west")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/slow.bin"
    )
    worker = threading.Thread(
        target=services.volume_fill_run, kwargs={"fill_id": fill.pk, "attempt": 0}
    )
    worker.start()
    try:
        deadline = time.monotonic() + 15
        # Bytes progress from the pod's reports reaches the row while the copy runs.
        while VolumeFill.objects.get(pk=fill.pk).bytes_done == 0:
            assert time.monotonic() < deadline, "no progress was reported"
            time.sleep(0.05)
        running = VolumeFill.objects.get(pk=fill.pk)
        assert 0 < running.bytes_done < len(SLOW_PAYLOAD)
        assert running.bytes_total == len(SLOW_PAYLOAD)
        assert len(fill_jobs(on_cluster)) == 1
        services.volume_fill_cancel(volume=volume, user=world.member)
    finally:
        worker.join(timeout=20)
    assert not worker.is_alive()
    fill.refresh_from_db()
    assert fill.status == FillStatus.CANCELLED
    assert fill_jobs(on_cluster) == []  # deleting the Job deleted its pod, which killed it
    time.sleep(3)  # had the copy gone on, the file would be in place by now
    assert not (claim_folder(tmp_path, volume) / "slow.bin").exists()


def test_a_rerun_stops_the_copy_its_dead_worker_left_running(
    world, on_cluster, http_base, tmp_path
):
    volume = VolumeFactory(tenant=world.tenant, name="rerun", region__slug="us-west")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/slow.bin"
    )
    # Run 1's worker started its copy Job and died.
    first = services._fill_claim(fill.pk, 0)
    assert first is not None and first.attempt == 1
    backend = services._fill_backend(volume)
    mount = VolumeMount(
        volume_id=volume.pk, name=volume.name, path="/volume", read_only=False,
        size_gib=volume.size_gib, shared=False,
    )  # fmt: skip
    backend.volume_fill_start(
        tenant_id=volume.tenant_id, mount=mount, fill_id=fill.pk, attempt=1,
        source=fill.source, endpoint="", credential="",
    )  # fmt: skip
    assert [j["metadata"]["name"] for j in fill_jobs(on_cluster)] == [f"gg-fill-{fill.pk}-1"]
    # The sweep's new run (2) removes run 1's copy before it starts its own.
    services.volume_fill_run(fill_id=fill.pk, attempt=1)
    fill.refresh_from_db()
    assert (fill.status, fill.attempt) == (FillStatus.SUCCEEDED, 2), fill.error
    assert fill_jobs(on_cluster) == []
    assert (claim_folder(tmp_path, volume) / "slow.bin").stat().st_size == len(SLOW_PAYLOAD)


def test_on_the_sandbox_jobs_see_the_filled_data_and_their_outputs_stay(
    world, on_cluster, http_base, tmp_path
):
    volume = VolumeFactory(tenant=world.tenant, name="data", region__slug="us-west")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/model.bin"
    )
    services.volume_fill_run(fill_id=fill.pk, attempt=0)

    def run_job(name: str) -> tuple[list[str], Job]:
        spec = gpu_spec(
            name=name,
            gpus_per_node=1,
            volumes=[{"name": "data", "path": "/data"}],
            env={"SANDBOX_DURATION_SECONDS": "1"},
        )
        job = settle(on_cluster, launch(world, spec), JobStatus.SUCCEEDED, timeout=20)
        return [line.text for line in get_backend("kubernetes").logs(job)], job

    lines, first = run_job("first")
    assert "volume /data: 1 file(s), 131,072 bytes: model.bin" in lines
    assert f"wrote /data/sandbox-outputs/job-{first.pk}/attempt-1.txt" in lines
    lines, _ = run_job("second")  # the next job finds what the first one wrote
    listed = next(line for line in lines if line.startswith("volume /data: "))
    assert listed.startswith("volume /data: 2 file(s)")
    assert f"sandbox-outputs/job-{first.pk}/attempt-1.txt" in listed
