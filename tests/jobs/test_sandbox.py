"""The sandbox cluster end to end: the real Kubernetes backend, through the official
client, against the simulated cluster (nodes made from the demo pools, simulated
training workloads, the Prometheus-compatible DCGM endpoint, chaos controls)."""

from __future__ import annotations

import re
import time
from decimal import Decimal

import httpx
import pytest
from django.urls import reverse

from console.models import AuditEvent
from jobs import services
from jobs.backends import BackendUnavailable, get_backend
from jobs.backends.kubernetes.sandbox import sandbox_nodes, write_sandbox_files
from jobs.models import Job, JobStatus
from jobs.services import JobSpec
from marketplace.demo import seed_catalog
from marketplace.models import NodePool
from marketplace.services import capacity_sync
from sandbox.cluster import SandboxCluster
from tests.conftest import signed_in_client
from tests.factories import MembershipFactory, UserFactory
from tests.jobs_helpers import launch

TOKEN = "sandbox-test-token"
ON_DEMAND = "demo-us-west-h100-80gb-on-demand"
SPOT = "demo-us-west-h100-80gb-spot"


@pytest.fixture
def sandbox(db, settings, tmp_path):
    """One node of the demo's us-west H100 on-demand and spot pools, and a CPU node."""
    cluster = start_sandbox(settings, tmp_path, {})
    yield cluster
    cluster.stop()
    assert cluster.server.errors == []


def start_sandbox(settings, tmp_path, node_counts: dict[str, int]) -> SandboxCluster:
    """The sandbox cluster made from the demo's us-west H100 on-demand and spot pools
    and its CPU pool, `node_counts` nodes each (by slug; 1 unless said), synced."""
    seed_catalog()
    pools = list(
        NodePool.objects.filter(slug__in=[ON_DEMAND, SPOT, "demo-us-west-cpu-on-demand"])
        .select_related("region", "gpu_type")
        .order_by("slug")
    )
    for pool in pools:
        pool.node_count = node_counts.get(pool.slug, 1)
    nodes = sandbox_nodes(pools)
    cluster = SandboxCluster(nodes, token=TOKEN, tick_seconds=0.05, pod_start_delay=0).start()
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text("[]")  # present: write_sandbox_files keeps it
    write_sandbox_files(
        nodes_file=nodes_file,
        kubeconfig_file=tmp_path / "kubeconfig",
        url=cluster.server.url,
        token=TOKEN,
    )
    settings.SANDBOX_URL = cluster.server.url
    settings.SANDBOX_TOKEN = TOKEN
    settings.KUBECONFIG = str(tmp_path / "kubeconfig")
    settings.PROMETHEUS_URL = f"{cluster.server.url}/prometheus"
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    settings.KUBERNETES_REQUEST_TIMEOUT = 2
    capacity_sync(backend=get_backend("kubernetes"))
    return cluster


@pytest.fixture
def staff_client(world):
    staff = UserFactory(email="staff@gpugeek.test", is_staff=True)
    MembershipFactory(tenant=world.tenant, user=staff, role="member")
    return signed_in_client(staff, world.tenant)


def spec(**overrides) -> JobSpec:
    values = {
        "name": "llama-finetune",
        "image": "pytorch-2-5-cuda12-4",
        "command": ["torchrun", "train.py"],
        "gpu_type": "h100-80gb",
        "gpus_per_node": 8,
        "cpus": 16,
        "region": "us-west",
        "env": {"SANDBOX_DURATION_SECONDS": "4", "SANDBOX_CHECKPOINT_SECONDS": "1"},
    }
    values.update(overrides)
    return JobSpec(**values)


def settle(job: Job, *statuses: str, timeout: float = 15) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        services.jobs_observe(backend_name="kubernetes")
        job.refresh_from_db()
        if job.status in statuses:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job stayed {job.status} ({job.status_reason})")
        time.sleep(0.05)


def wait_for_log(backend, job: Job, text: str, timeout: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [line.text for line in backend.logs(job)]
        if any(text in line for line in lines):
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not in the log: {lines[-5:]}")
        time.sleep(0.1)


def test_sync_keeps_the_demo_pools_and_marks_them_simulated(sandbox):
    on_demand = NodePool.objects.get(slug=ON_DEMAND)
    assert (on_demand.node_count, on_demand.total_gpus, on_demand.simulated) == (1, 8, True)
    # No second pool for the same nodes: the gpugeek.io/pool label names the demo pool.
    assert not NodePool.objects.filter(slug__startswith="kubernetes-").exists()
    # Pools without sandbox nodes keep their row but no capacity.
    assert NodePool.objects.get(slug="demo-us-east-mi300x-on-demand").total_gpus == 0


def test_offers_say_simulated(sandbox, world, client):
    client.force_login(world.member)
    page = client.get(reverse("marketplace:offers"))
    assert page.status_code == 200
    assert b"badge-simulated" in page.content
    offers = client.get("/api/v1/offers?gpu_type=h100-80gb&region=us-west").json()
    rows = offers["results"] if isinstance(offers, dict) else offers
    assert {row["tier"]: row["simulated"] for row in rows}["on_demand"] is True


def test_a_job_plays_a_simulated_training_run_with_gpu_readings(sandbox, world, client):
    job = settle(launch(world, spec(checkpoint_path="/ckpt/llama")), JobStatus.RUNNING)
    backend = get_backend("kubernetes")
    lines = wait_for_log(backend, job, "saved checkpoint /ckpt/llama/step-")
    assert lines[0].startswith("[sandbox] Simulated workload")
    assert "[sandbox] command: torchrun train.py" in lines
    assert any(re.match(r"epoch [1-5]/5 step \d+/8 loss \d\.\d{4} ", line) for line in lines)

    readings = backend.gpu_readings([job])[job.pk]
    assert sorted(r.gpu for r in readings) == list(range(8))
    assert all(0 <= r.utilization <= 100 for r in readings)
    assert all(r.memory_total_mib == 80 * 1024 for r in readings)

    client.force_login(world.member)
    page = client.get(reverse("jobs:detail", args=[job.pk]))
    assert b"badge-simulated" in page.content

    job = settle(job, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert job.status == JobStatus.SUCCEEDED, job.status_reason
    assert "training complete" in wait_for_log(backend, job, "training complete")[-1]


def test_sandbox_fail_at_ends_the_job_failed(sandbox, world):
    job = launch(world, spec(env={"SANDBOX_DURATION_SECONDS": "30", "SANDBOX_FAIL_AT": "1"}))
    job = settle(job, JobStatus.FAILED)
    assert job.exit_code == 1
    assert "exit code 1" in job.status_reason


def test_reclaiming_spot_capacity_preempts_and_resumes_from_the_checkpoint(
    sandbox, world, staff_client
):
    job = launch(
        world,
        spec(
            spot_ratio=Decimal("1"),
            checkpoint_path="/ckpt/run",
            env={"SANDBOX_DURATION_SECONDS": "60", "SANDBOX_CHECKPOINT_SECONDS": "1"},
        ),
    )
    job = settle(job, JobStatus.RUNNING)
    backend = get_backend("kubernetes")
    wait_for_log(backend, job, "saved checkpoint /ckpt/run/step-")

    answer = staff_client.post(f"/api/v1/sandbox/pools/{SPOT}/reclaim-spot")
    assert answer.status_code == 200, answer.content
    assert len(answer.json()["evicted_pods"]) == 1
    assert AuditEvent.objects.filter(action="sandbox.spot_reclaimed").count() == 1

    job = settle(job, JobStatus.DISPATCHING, JobStatus.QUEUED)
    assert job.attempt == 2
    preempted = job.events.get(to_status="preempted")
    assert "TerminationByKubelet" in preempted.reason or "reclaimed" in preempted.reason
    assert not job.events.filter(to_status="failed").exists()
    job = services.job_dispatch(job=job)
    job = settle(job, JobStatus.RUNNING)
    lines = wait_for_log(backend, job, "GPUGEEK_RESUMED=1: resuming from /ckpt/run at step ")
    resumed_at = int(next(line for line in lines if "resuming from" in line).split()[-1])
    assert resumed_at > 0


def test_chaos_api_checks_its_input_and_who_asks(sandbox, world, staff_client, client):
    assert staff_client.post(f"/api/v1/sandbox/pools/{ON_DEMAND}/reclaim-spot").status_code == 400
    bad = staff_client.post(
        "/api/v1/sandbox/api-faults",
        {"mode": "error", "fraction": 2, "seconds": 5},
        "application/json",
    )
    assert bad.status_code == 400 and "fraction" in bad.json()
    assert staff_client.post("/api/v1/sandbox/nodes/nope/fail").status_code == 400
    client.force_login(world.member)
    assert client.get("/api/v1/sandbox/nodes").status_code == 404
    nodes = staff_client.get("/api/v1/sandbox/nodes").json()["nodes"]
    assert {node["pool"] for node in nodes} >= {ON_DEMAND, SPOT}


def test_api_faults_make_the_backend_unavailable_then_clear(sandbox, staff_client):
    backend = get_backend("kubernetes")
    on = staff_client.post(
        "/api/v1/sandbox/api-faults",
        {"mode": "error", "fraction": 1, "seconds": 30},
        "application/json",
    )
    assert on.status_code == 200, on.content
    with pytest.raises(BackendUnavailable):
        backend.inventory()
    assert staff_client.delete("/api/v1/sandbox/api-faults").status_code == 200
    assert len(backend.inventory()) == 3


def test_node_failure_and_recovery(sandbox, staff_client):
    node = f"{ON_DEMAND}-0"
    page = staff_client.get(reverse("jobs:staff_sandbox_node_fail", args=[node]))
    assert page.status_code == 200 and b"Fail node" in page.content
    staff_client.post(reverse("jobs:staff_sandbox_node_fail", args=[node]))
    nodes = {n["name"]: n for n in staff_client.get("/api/v1/sandbox/nodes").json()["nodes"]}
    assert nodes[node]["ready"] is False
    staff_client.post(reverse("jobs:staff_sandbox_node_recover", args=[node]))
    nodes = {n["name"]: n for n in staff_client.get("/api/v1/sandbox/nodes").json()["nodes"]}
    assert nodes[node]["ready"] is True


def test_staff_page_lists_nodes_and_spot_pools(sandbox, staff_client):
    page = staff_client.get(reverse("jobs:staff_sandbox"))
    assert page.status_code == 200
    assert f"{ON_DEMAND}-0".encode() in page.content
    assert (
        reverse("jobs:staff_sandbox_reclaim", args=[NodePool.objects.get(slug=SPOT).pk]).encode()
        in page.content
    )


def test_without_a_sandbox_the_controls_say_so(db, settings, staff_client):
    settings.SANDBOX_URL = ""
    page = staff_client.get(reverse("jobs:staff_sandbox"))
    assert b"No simulated cluster is running" in page.content
    answer = staff_client.get("/api/v1/sandbox/nodes")
    assert answer.status_code == 409 and "sandbox" in answer.json()["detail"]


def test_prometheus_endpoint_and_control_api_need_their_paths_and_token(sandbox):
    url = sandbox.server.url
    assert httpx.get(f"{url}/sandbox/v1/nodes").status_code == 401
    ok = httpx.get(f"{url}/sandbox/v1/nodes", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    vector = httpx.get(f"{url}/prometheus/api/v1/query", params={"query": "up"}).json()
    assert vector["status"] == "success" and vector["data"]["resultType"] == "vector"
