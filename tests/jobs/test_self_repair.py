"""Self-repair of a hardware fault, end to end on the sandbox cluster: staff inject an XID
error on the node a training job runs on (chaos API); the next metrics tick reads it
through the Prometheus-compatible DCGM endpoint; the job is checkpointed and requeued
through the state machine (the timeline names the rule and the readings), the node is
marked suspect (capacity leaves it out, it is cordoned), and the next attempt runs on
the pool's other node and resumes from its latest checkpoint. Staff mark it healthy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from console.models import AuditEvent, Notification
from jobs import metrics, repair
from jobs.actors import ActorKind
from jobs.backends import get_backend
from jobs.backends.base import GpuReading
from jobs.backends.kubernetes.lifecycle import suspect_nodes_by_pool
from jobs.backends.kubernetes.manifests.names import namespace_name
from jobs.backends.kubernetes.manifests.workload import job_manifests
from jobs.models import AlertKind, Job, JobAlert, JobMetricSample, JobStatus
from marketplace.models import NodePool, SuspectNode
from marketplace.services import capacity_sync, node_mark_suspect
from tests.jobs.test_sandbox import (
    ON_DEMAND,
    sandbox,  # noqa: F401  (a fixture)
    settle,
    spec,
    staff_client,  # noqa: F401  (a fixture)
    start_sandbox,
    wait_for_log,
)
from tests.jobs_helpers import advance_to, launch, submit


@pytest.fixture
def two_nodes(db, settings, tmp_path):
    """The sandbox with two on-demand H100 nodes: one to fail, one to resume on."""
    cluster = start_sandbox(settings, tmp_path, {ON_DEMAND: 2})
    yield cluster
    cluster.stop()
    assert cluster.server.errors == []


def node_of(cluster, job: Job) -> str:
    [pod] = [
        pod
        for pod in cluster.server.list("pods", namespace=namespace_name(job.tenant_id))
        if pod["metadata"]["name"].startswith(f"gg-{job.pk}-a{job.attempt}-")
        and pod["status"].get("phase") == "Running"
    ]
    return pod["spec"]["nodeName"]


def test_an_xid_error_moves_the_job_off_its_node_and_it_resumes_there(
    two_nodes,
    world,
    staff_client,  # noqa: F811  (the fixture imported above)
    tasks_in_process,
    django_capture_on_commit_callbacks,
):
    job = launch(
        world,
        spec(
            checkpoint_path="/ckpt/run",
            env={"SANDBOX_DURATION_SECONDS": "60", "SANDBOX_CHECKPOINT_SECONDS": "1"},
        ),
    )
    job = settle(job, JobStatus.RUNNING)
    backend = get_backend("kubernetes")
    wait_for_log(backend, job, "saved checkpoint /ckpt/run/step-")
    faulty = node_of(two_nodes, job)
    pool = NodePool.objects.get(slug=ON_DEMAND)
    assert pool.allocatable_gpus == 16

    answer = staff_client.post(
        f"/api/v1/sandbox/nodes/{faulty}/xid-error", {"code": 79}, "application/json"
    )
    assert answer.status_code == 200, answer.content
    assert AuditEvent.objects.filter(action="sandbox.xid_error").count() == 1
    with django_capture_on_commit_callbacks(execute=True):
        metrics.metrics_collect()

    alert = JobAlert.objects.get(job=job, kind=AlertKind.HARDWARE_FAULT)
    assert alert.severity == "critical"
    assert f"{faulty} GPU 0: XID 79" in alert.message
    job.refresh_from_db()
    assert job.attempt == 2
    preempted = job.events.get(to_status=JobStatus.PREEMPTED)
    assert preempted.actor_kind == ActorKind.ALERT
    assert "self-repair, hardware fault (XID error)" in preempted.reason
    assert f"{faulty} GPU 7: XID 79" in preempted.reason
    told = Notification.objects.get(user=world.member, title__contains="faulty node")
    assert told.title == "llama-finetune was moved off a faulty node"
    assert f"{faulty} GPU 0: XID 79" in told.body
    suspect = SuspectNode.objects.get(name=faulty)
    assert suspect.pool == pool and suspect.cordoned
    assert two_nodes.server.get("nodes", None, faulty)["spec"]["unschedulable"] is True
    pool.refresh_from_db()
    assert pool.allocatable_gpus == 8  # the suspect node is left out at once
    capacity_sync(backend=backend)
    pool.refresh_from_db()
    assert pool.allocatable_gpus == 8  # and by every sync after

    # The next attempt was admitted and dispatched in the same tick, away from the node.
    job = settle(job, JobStatus.RUNNING)
    assert job.attempt == 2
    assert node_of(two_nodes, job) != faulty
    lines = wait_for_log(backend, job, "GPUGEEK_RESUMED=1: resuming from /ckpt/run at step ")
    assert int(next(line for line in lines if "resuming from" in line).split()[-1]) > 0

    fleet = staff_client.get(reverse("jobs:staff_fleet")).content.decode()
    assert faulty in fleet and "Mark healthy" in fleet
    url = reverse("jobs:staff_node_healthy", args=[suspect.pk])
    confirm = staff_client.get(url).content.decode()
    assert "XID 79" in confirm and "uncordoned" in confirm
    with django_capture_on_commit_callbacks(execute=True):
        assert staff_client.post(url).status_code == 302
    assert not SuspectNode.objects.exists()
    assert not two_nodes.server.get("nodes", None, faulty)["spec"].get("unschedulable")
    assert AuditEvent.objects.filter(action="node.marked_healthy").count() == 1


def test_with_hardware_repair_off_an_xid_error_leaves_the_job_running(
    sandbox,  # noqa: F811  (the fixture imported above)
    world,
    staff_client,  # noqa: F811
    tasks_in_process,
    django_capture_on_commit_callbacks,
):
    """The organisation turned hardware repair off: the fault is alerted (saying so) and
    the node marked suspect and cordoned, but the job runs on where it was."""
    world.tenant.hardware_repair_default = False
    world.tenant.save(update_fields=["hardware_repair_default"])
    job = launch(world, spec(env={"SANDBOX_DURATION_SECONDS": "60"}))
    job = settle(job, JobStatus.RUNNING)
    faulty = node_of(sandbox, job)
    answer = staff_client.post(
        f"/api/v1/sandbox/nodes/{faulty}/xid-error", {"code": 48}, "application/json"
    )
    assert answer.status_code == 200, answer.content
    with django_capture_on_commit_callbacks(execute=True):
        metrics.metrics_collect()

    alert = JobAlert.objects.get(job=job, kind=AlertKind.HARDWARE_FAULT)
    assert alert.severity == "critical"
    assert f"Hardware repair is off for this job: it keeps running on {faulty}" in alert.message
    assert SuspectNode.objects.get(name=faulty).cordoned
    assert sandbox.server.get("nodes", None, faulty)["spec"]["unschedulable"] is True
    job = settle(job, JobStatus.RUNNING)
    assert job.attempt == 1 and node_of(sandbox, job) == faulty
    assert not job.events.filter(to_status=JobStatus.PREEMPTED).exists()


def test_pods_avoid_the_pools_suspect_nodes_even_uncordoned(world, catalog, settings):
    """Where the console may not cordon (RBAC), the pods still keep off the node."""
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    job = submit(world, "train", gpu_type="h100-80gb", region="us-west", gpus_per_node=8, cpus=8)
    node_mark_suspect(name="h100-node-7", pool=job.pool, reason="XID 48")
    job = Job.objects.with_backend_relations().get(pk=job.pk)
    avoid = [name for pool_id, names in suspect_nodes_by_pool().items() for name in names]
    assert avoid == ["h100-node-7"]
    [workload] = job_manifests(job, avoid_nodes=avoid)
    terms = workload["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    away = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["h100-node-7"]}
    assert all(away in term["matchExpressions"] for term in terms)


def test_only_staff_reach_the_healthy_page_and_the_xid_control(world, catalog, client):
    node = node_mark_suspect(name="h100-node-7", pool=None, reason="XID 48")
    client.force_login(world.owner)
    assert client.get(reverse("jobs:staff_node_healthy", args=[node.pk])).status_code == 404
    assert client.post(reverse("jobs:staff_node_healthy", args=[node.pk])).status_code == 404
    assert client.post("/api/v1/sandbox/nodes/x/xid-error", {}).status_code in (403, 404)
    assert SuspectNode.objects.filter(pk=node.pk).exists()


# --- a rank stuck while the others run --------------------------------------------------------

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def readings_over(job, minutes: int, by_rank: dict[str, float]) -> list[JobMetricSample]:
    """Samples every 30 s for `minutes` up to NOW, each rank at its utilisation."""
    return [
        JobMetricSample(
            job=job, at=NOW - timedelta(seconds=30 * step), node=rank, gpu=0, utilization=value
        )
        for step in range(minutes * 2 + 1)
        for rank, value in by_rank.items()
    ]


def test_a_rank_idle_for_the_window_while_the_others_run_is_stuck():
    stuck = repair.stuck_ranks(readings_over(None, 6, {"rank 0": 93.0, "rank 1": 0.0}), NOW)
    assert stuck == {"rank 1": (0.0, 93.0)}
    # Not yet for the whole window, every rank idle, or a lone rank: not stuck.
    assert repair.stuck_ranks(readings_over(None, 4, {"rank 0": 93.0, "rank 1": 0.0}), NOW) == {}
    assert repair.stuck_ranks(readings_over(None, 6, {"rank 0": 1.0, "rank 1": 0.0}), NOW) == {}
    assert repair.stuck_ranks(readings_over(None, 6, {"rank 0": 0.0}), NOW) == {}
    # One reading above the floor in the window: it was working.
    samples = readings_over(None, 6, {"rank 0": 93.0, "rank 1": 0.0})
    samples[3].utilization = 40.0
    assert repair.stuck_ranks(samples, NOW) == {}


def test_a_stuck_rank_moves_the_job_off_its_node(
    world, catalog, settings, django_capture_on_commit_callbacks
):
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    job = submit(
        world, "gang", gpu_type="h100-80gb", region="us-west", gpus_per_node=8, cpus=8, nodes=2
    )
    job = advance_to(job, JobStatus.RUNNING)
    samples = readings_over(job, 6, {"rank 0": 91.0, "rank 1": 0.0})
    readings = [
        GpuReading(node="rank 0", gpu=0, utilization=91.0, host="h100-a"),
        GpuReading(node="rank 1", gpu=0, utilization=0.0, host="h100-b"),
    ]
    with django_capture_on_commit_callbacks() as callbacks:
        alert = repair.job_stuck_rank(job=job, readings=readings, samples=samples, now=NOW)
    assert alert.kind == AlertKind.STUCK_RANK
    assert "rank 1 on h100-b: GPU utilisation at most 0 % for 5 min" in alert.message
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED or job.status == JobStatus.DISPATCHING
    assert job.attempt == 2
    assert "self-repair, a rank stuck while the others run" in (
        job.events.get(to_status=JobStatus.PREEMPTED).reason
    )
    assert list(SuspectNode.objects.values_list("name", flat=True)) == ["h100-b"]
    assert len(callbacks) >= 2  # the old attempt's stop and the node's cordon, after commit
    # Within the cool-down the same finding isn't acted on twice.
    assert repair.job_stuck_rank(job=job, readings=readings, samples=samples, now=NOW) is None


def test_hung_gpus_read_zero_busy_through_the_dcgm_endpoint(sandbox, world, staff_client):  # noqa: F811
    job = settle(launch(world, spec(env={"SANDBOX_DURATION_SECONDS": "60"})), JobStatus.RUNNING)
    backend = get_backend("kubernetes")
    node = node_of(sandbox, job)
    assert all(r.utilization > 50 for r in backend.gpu_readings([job])[job.pk])
    answer = staff_client.post(f"/api/v1/sandbox/nodes/{node}/stuck-gpus")
    assert answer.status_code == 200, answer.content
    readings = backend.gpu_readings([job])[job.pk]
    assert {r.utilization for r in readings} == {0.0} and {r.host for r in readings} == {node}
    assert AuditEvent.objects.filter(action="sandbox.stuck_gpus").count() == 1
    staff_client.post(reverse("jobs:staff_sandbox_node_recover", args=[node]))
    assert all(r.utilization > 50 for r in backend.gpu_readings([job])[job.pk])


def test_double_bit_ecc_errors_read_through_dcgm_and_count_as_a_hardware_fault(
    sandbox,  # noqa: F811
    world,
    staff_client,  # noqa: F811
):
    job = settle(launch(world, spec(env={"SANDBOX_DURATION_SECONDS": "60"})), JobStatus.RUNNING)
    backend = get_backend("kubernetes")
    node = node_of(sandbox, job)
    answer = staff_client.post(
        f"/api/v1/sandbox/nodes/{node}/xid-error", {"code": 48}, "application/json"
    )
    assert answer.status_code == 200, answer.content
    readings = backend.gpu_readings([job])[job.pk]
    assert {(r.xid, r.ecc_dbe) for r in readings} == {(48, 1)}
    assert all(r.faulty and r.fault == "XID 48, 1 double-bit ECC error" for r in readings)

    # ECC errors alone (no XID reported) are a fault too, under their own rule.
    ecc_only = [GpuReading(node="rank 0", gpu=0, host=node, ecc_dbe=2)]
    alert = repair.job_hardware_fault(job=job, faulty=ecc_only, now=datetime.now(UTC))
    assert alert is not None and f"{node} GPU 0: 2 double-bit ECC errors" in alert.message
    preempted = job.events.get(to_status=JobStatus.PREEMPTED)
    assert "self-repair, hardware fault (double-bit ECC errors)" in preempted.reason
    staff_client.post(reverse("jobs:staff_sandbox_node_recover", args=[node]))
