"""The Kubernetes backend against the fake API server, through the real services: launch,
dispatch, the watcher's observation pass, pause/resume, cancel, preemption and faults."""

from __future__ import annotations

import base64
import itertools
import json
import queue
import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.metering import meter_tick
from billing.models import JobMeter, UsageRecord
from jobs import services, tasks
from jobs.actors import SYSTEM
from jobs.backends import get_backend
from jobs.backends.kubernetes import KubernetesBackend, manifests
from jobs.backends.kubernetes import client as kubernetes_client
from jobs.backends.kubernetes.watch import watch_jobs
from jobs.checkpoints.store import MANIFEST_NAME, checkpoint_store
from jobs.management.commands.run_watcher import next_changes, observe_pass, start_watches
from jobs.models import Job, JobStatus
from jobs.services import JobSpec
from marketplace.demo import seed_catalog
from marketplace.models import AllowedRegistry, NodePool, RegistryCredential, TenantQuota
from marketplace.services import (
    capacity_sync,
    image_create,
    registry_credential_delete,
    registry_credential_set,
)
from sandbox.kubesim import PodRun
from tests.concurrency import run_at_once
from tests.console.test_prometheus_metrics import TOKEN, scrape, value
from tests.jobs_helpers import launch

H100 = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "topology.kubernetes.io/region": "us-west",
}


@pytest.fixture
def cluster(db, kube_api, settings, tmp_path):
    """Two H100 nodes (on-demand, spot) and a CPU node in us-west, synced into pools."""
    seed_catalog()
    NodePool.objects.filter(slug__startswith="demo-").update(is_active=False)
    kube_api.add_node("h100-od-1", labels=H100)
    kube_api.add_node(
        "h100-spot-1",
        labels={**H100, "gpugeek.io/tier": "spot"},
        taints=[{"key": "gpugeek.io/spot", "value": "true", "effect": "NoSchedule"}],
    )
    kube_api.add_node(
        "cpu-1",
        labels={"topology.kubernetes.io/region": "us-west"},
        allocatable={"cpu": "32", "memory": "128Gi"},
    )
    capacity_sync(backend=KubernetesBackend(kube_api.api_client()))
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    settings.KUBECONFIG = str(kube_api.kubeconfig_path(tmp_path))
    settings.KUBERNETES_REQUEST_TIMEOUT = 2
    return kube_api


def gpu_spec(**overrides) -> JobSpec:
    values = {
        "name": "train",
        "image": "pytorch-2-5-cuda12-4",
        "command": ["torchrun", "train.py"],
        "gpu_type": "h100-80gb",
        "gpus_per_node": 8,
        "cpus": 16,
        "region": "us-west",
    }
    values.update(overrides)
    return JobSpec(**values)


def settle(cluster, job: Job, *statuses: str, timeout: float = 10) -> Job:
    """Run the watcher's pass until the job reaches one of `statuses`."""
    deadline = time.monotonic() + timeout
    while True:
        cluster.tick()
        services.jobs_observe(backend_name="kubernetes")
        job.refresh_from_db()
        if job.status in statuses:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job stayed {job.status} ({job.status_reason})")
        time.sleep(0.05)


def ns(job: Job) -> str:
    return f"gg-t-{job.tenant_id}"


def live_pods(cluster, job: Job) -> list[dict]:
    return [
        p
        for p in cluster.list("pods", ns(job), label_selector=f"gpugeek.io/job={job.pk}")
        if p["status"].get("phase") in ("Pending", "Running")
    ]


def test_two_tier_job_runs_logs_and_succeeds(world, cluster):
    def script(pod: dict) -> PodRun:
        annotations = pod["metadata"]["annotations"]
        rank = int(annotations["batch.kubernetes.io/job-completion-index"]) + int(
            annotations["gpugeek.io/rank-offset"]
        )
        return PodRun(logs=[f"rank {rank} line 1", f"rank {rank} line 2"])

    cluster.pod_script = script
    job = launch(world, gpu_spec(nodes=2, spot_ratio=Decimal("0.5")))
    assert (job.on_demand_nodes, job.spot_nodes) == (1, 1)
    namespace = cluster.get("namespaces", None, ns(job))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert cluster.get("services", ns(job), f"gg-{job.pk}")["spec"]["clusterIP"] == "None"

    job = settle(cluster, job, JobStatus.RUNNING)
    on_demand = cluster.job_pods(ns(job), f"gg-{job.pk}-a1")
    spot = cluster.job_pods(ns(job), f"gg-{job.pk}-a1-spot")
    assert [p["spec"]["nodeName"] for p in on_demand + spot] == ["h100-od-1", "h100-spot-1"]
    assert on_demand[0]["spec"]["hostname"] == f"gg-{job.pk}-a1-0"

    backend = get_backend("kubernetes")
    lines = backend.logs(job)
    assert [(line.line_no, line.rank, line.text) for line in lines] == [
        (1, 0, "rank 0 line 1"),
        (2, 0, "rank 0 line 2"),
        (3, 1, "rank 1 line 1"),
        (4, 1, "rank 1 line 2"),
    ]
    assert [line.line_no for line in backend.logs(job, since_line=2, limit=1)] == [3]

    cluster.succeed_job(ns(job), f"gg-{job.pk}-a1")
    job = settle(cluster, job, JobStatus.RUNNING)  # one rank done, the other still running
    cluster.succeed_job(ns(job), f"gg-{job.pk}-a1-spot")
    job = settle(cluster, job, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert job.status == JobStatus.SUCCEEDED and job.exit_code == 0
    assert [e.to_status for e in job.events.all()][-3:] == ["provisioning", "running", "succeeded"]


def test_pause_releases_pods_and_resume_restarts_same_job(world, cluster):
    job = settle(cluster, launch(world, gpu_spec()), JobStatus.RUNNING)
    first_pod = live_pods(cluster, job)[0]["metadata"]["name"]

    job = services.job_pause(job=job, actor=SYSTEM)
    assert job.status == JobStatus.PAUSING
    tasks.job_suspend_task(job.pk)
    job = settle(cluster, job, JobStatus.PAUSED)
    assert live_pods(cluster, job) == []
    assert "compute released" in job.status_reason
    # A checkpoint the job saved before the pause, in the protocol's format.
    prefix = checkpoint_store().local_folder(f"{job.tenant_id}/{job.pk}/")
    (prefix / "12").mkdir(parents=True)
    (prefix / "12" / "model.pt").write_bytes(b"weights")
    manifest = {
        "step": 12,
        "time": timezone.now().isoformat(),
        "files": [{"path": "model.pt", "size": 7}],
    }
    (prefix / "12" / MANIFEST_NAME).write_text(json.dumps(manifest))

    job = services.job_resume(job=job, actor=SYSTEM)
    tasks.job_resume_task(job.pk)
    job = settle(cluster, job, JobStatus.RUNNING)
    (pod,) = live_pods(cluster, job)
    assert pod["metadata"]["name"] != first_pod
    assert pod["metadata"]["annotations"]["gpugeek.io/resumed"] == "1"
    # GPUGEEK_RESUME_FROM reads this annotation, patched with the flag.
    resume_from = pod["metadata"]["annotations"]["gpugeek.io/resume-from"]
    assert resume_from == f"file://{prefix}/12/{MANIFEST_NAME}"
    assert pod["metadata"]["labels"]["job-name"] == f"gg-{job.pk}-a1"  # same Job, same name
    assert [j["metadata"]["name"] for j in cluster.list("jobs", ns(job))] == [f"gg-{job.pk}-a1"]


def test_a_pause_is_done_when_the_job_controller_says_suspended_not_when_the_pods_are_gone(
    world, cluster
):
    """Until the Job controller writes `Suspended` it has not cleared `startTime`, and a
    resume then could not flag the pods as resumed (the template is immutable)."""
    job = settle(cluster, launch(world, gpu_spec()), JobStatus.RUNNING)
    job = services.job_pause(job=job, actor=SYSTEM)
    tasks.job_suspend_task(job.pk)
    cluster.tick()  # the pods go; then, as if the controller's status write were late:
    assert live_pods(cluster, job) == []

    def not_yet_written(kube_job: dict) -> None:
        status = kube_job["status"]
        status["conditions"] = [c for c in status["conditions"] if c["type"] != "Suspended"]
        status["startTime"] = timezone.now().isoformat()

    cluster.mutate("jobs", ns(job), f"gg-{job.pk}-a1", not_yet_written)
    services.jobs_observe(backend_name="kubernetes")
    job.refresh_from_db()
    assert job.status == JobStatus.PAUSING

    job = settle(cluster, job, JobStatus.PAUSED)
    job = services.job_resume(job=job, actor=SYSTEM)
    tasks.job_resume_task(job.pk)
    job = settle(cluster, job, JobStatus.RUNNING)
    (pod,) = live_pods(cluster, job)
    assert pod["metadata"]["annotations"]["gpugeek.io/resumed"] == "1"


def test_a_lone_pod_without_ports_gets_no_service_and_rendezvous_on_itself(world, cluster):
    lone = settle(cluster, launch(world, gpu_spec(gpus_per_node=4)), JobStatus.RUNNING)
    (pod,) = live_pods(cluster, lone)
    env = {entry["name"]: entry.get("value") for entry in pod["spec"]["containers"][0]["env"]}

    assert cluster.get("services", ns(lone), f"gg-{lone.pk}") is None
    assert (env["MASTER_ADDR"], env["WORLD_SIZE"]) == ("localhost", "1")
    assert "subdomain" not in pod["spec"]
    # One with ports is reached through its Service, so it gets one.
    served = launch(world, gpu_spec(gpus_per_node=4, ports=[{"name": "jupyter", "port": 8888}]))
    service = cluster.get("services", ns(served), f"gg-{served.pk}")
    assert [port["port"] for port in service["spec"]["ports"]][1:] == [8888]


def test_cancel_leaves_nothing_behind(world, cluster):
    spec = gpu_spec(secret_env={"HF_TOKEN": "hf_secret"}, ports=[{"name": "ssh", "port": 2222}])
    cluster.pod_start_delay = 60  # (its pod is not running until the check below says so)
    job = launch(world, spec)
    secret = cluster.get("secrets", ns(job), f"gg-{job.pk}-env")
    assert set(secret["data"]) == {"HF_TOKEN"}
    assert cluster.get("services", ns(job), f"gg-{job.pk}") is not None
    # Its ports are open to the console's gateways only (the namespace denies the rest).
    policy = cluster.get("networkpolicies", ns(job), f"gg-{job.pk}")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 2222}]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "gpugeek"}
    assert peer["podSelector"]["matchExpressions"][0]["values"] == ["web", "ssh-gateway"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"gpugeek.io/job": str(job.pk)}
    backend = get_backend("kubernetes")
    assert backend.port_address(job, 2222) is None  # not running yet
    cluster.pod_start_delay = 0
    job = settle(cluster, job, JobStatus.RUNNING)
    (pod,) = live_pods(cluster, job)
    assert backend.port_address(job, 2222) == (pod["status"]["podIP"], 2222)
    assert backend.port_address(job, 8888) is None  # not a port it declared

    job = services.job_cancel(job=job, actor=SYSTEM)
    assert job.status == JobStatus.CANCELLING  # until its pods are seen gone
    tasks.job_cancel_task(job.pk)
    tasks.job_cancel_task(job.pk)  # twice is fine
    assert cluster.list("jobs", ns(job)) == []
    assert cluster.list("pods", ns(job), label_selector=f"gpugeek.io/job={job.pk}") == []
    assert cluster.get("services", ns(job), f"gg-{job.pk}") is None
    assert cluster.get("secrets", ns(job), f"gg-{job.pk}-env") is None
    assert cluster.get("networkpolicies", ns(job), f"gg-{job.pk}") is None
    assert (
        settle(cluster, job, JobStatus.CANCELLED).status_reason
        == "cancelled by user; compute released"
    )


def test_a_tier_left_running_after_its_job_ended_is_stopped(
    world, cluster, tasks_in_process, django_capture_on_commit_callbacks
):
    """A two-tier job whose spot tier is lost fails; the on-demand tier still running
    (with its GPUs) is deleted by the release that follows. A create the client gave up on
    may land after a cancel found nothing to delete: the reconciler's release removes it."""
    job = settle(
        cluster, launch(world, gpu_spec(nodes=2, spot_ratio=Decimal("0.5"))), JobStatus.RUNNING
    )
    on_demand = cluster.get("jobs", ns(job), f"gg-{job.pk}-a1")
    cluster.delete("jobs", ns(job), f"gg-{job.pk}-a1-spot")
    cluster.tick()
    with django_capture_on_commit_callbacks(execute=True):
        services.jobs_observe(backend_name="kubernetes")
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.status_reason.startswith("lost: ")
    assert cluster.list("jobs", ns(job)) == [] and live_pods(cluster, job) == []

    # The late create: the tier appears again, running, for the finished job.
    late = {"metadata": {k: on_demand["metadata"][k] for k in ("name", "labels")}}
    cluster.create("jobs", {**late, "spec": on_demand["spec"]}, namespace=ns(job))
    cluster.tick()
    assert live_pods(cluster, job)
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(seconds=120))
    with django_capture_on_commit_callbacks(execute=True):
        assert job.pk in services.jobs_reconcile()
    cluster.tick()
    assert cluster.list("jobs", ns(job)) == [] and live_pods(cluster, job) == []


def test_a_cancelled_job_is_billed_until_its_last_pod_is_gone(world, cluster):
    """On a cluster the cancel deletes the Jobs, and their pods terminate (SIGTERM, then
    the grace period) before their GPUs are free. The simulator deletes pods at once, so a
    pod of the attempt that is still there after the cancel stands in for one still
    terminating: the job stays cancelling, metered, until it is gone."""
    job = settle(cluster, launch(world, gpu_spec()), JobStatus.RUNNING)
    labels = live_pods(cluster, job)[0]["metadata"]["labels"]
    job = services.job_cancel(job=job, actor=SYSTEM)
    assert job.status == JobStatus.CANCELLING
    tasks.job_cancel_task(job.pk)
    assert live_pods(cluster, job) == []
    cluster.create(
        "pods",
        {
            "metadata": {"name": f"gg-{job.pk}-a1-terminating", "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        },
        namespace=ns(job),
    )
    for _ in range(3):
        cluster.tick()
        services.jobs_observe(backend_name="kubernetes")
        meter_tick(now=timezone.now())
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLING and JobMeter.objects.get(job=job).open
    # Its GPUs are still taken: another job of the same size waits.
    waiting = services.job_submit(tenant=world.tenant, user=world.member, spec=gpu_spec())
    assert waiting.status == JobStatus.QUEUED

    cluster.delete("pods", ns(job), f"gg-{job.pk}-a1-terminating")
    job = settle(cluster, job, JobStatus.CANCELLED)
    meter_tick(now=timezone.now())
    running_at, end_at = (
        job.events.get(to_status=s).at for s in (JobStatus.RUNNING, JobStatus.CANCELLED)
    )
    records = UsageRecord.objects.filter(job_ref=job.pk)
    billed = sum((r.interval_end - r.interval_start).total_seconds() for r in records)
    assert abs(billed - (end_at - running_at).total_seconds()) <= 0.001 * len(records)
    assert not JobMeter.objects.get(job=job).open
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.DISPATCHING


def test_spot_preemption_requeues_a_new_attempt(world, cluster):
    job = settle(
        cluster, launch(world, gpu_spec(nodes=2, spot_ratio=Decimal("0.5"))), JobStatus.RUNNING
    )
    (spot_pod,) = cluster.job_pods(ns(job), f"gg-{job.pk}-a1-spot")
    cluster.evict_pod(ns(job), spot_pod["metadata"]["name"], reason="PreemptionByScheduler")

    services.jobs_observe(backend_name="kubernetes")
    job.refresh_from_db()
    assert job.attempt == 2
    assert job.status == JobStatus.DISPATCHING  # requeued and admitted again at once
    statuses = [(e.to_status, e.attempt) for e in job.events.all()]
    assert ("preempted", 1) in statuses and ("queued", 2) in statuses
    preempted = job.events.get(to_status="preempted")
    assert "PreemptionByScheduler" in preempted.reason
    # the surviving on-demand rank of attempt 1 was stopped with it
    assert cluster.get("jobs", ns(job), f"gg-{job.pk}-a1") is None

    job = services.job_dispatch(job=job)
    assert job.status == JobStatus.PROVISIONING
    job = settle(cluster, job, JobStatus.RUNNING)
    names = sorted(j["metadata"]["name"] for j in cluster.list("jobs", ns(job)))
    assert names == [f"gg-{job.pk}-a2", f"gg-{job.pk}-a2-spot"]
    env = {
        e["name"]: e.get("value")
        for e in cluster.get("jobs", ns(job), f"gg-{job.pk}-a2")["spec"]["template"]["spec"][
            "containers"
        ][0]["env"]
    }
    assert env["GPUGEEK_ATTEMPT"] == "2" and env["MASTER_ADDR"] == f"gg-{job.pk}-a2-0.gg-{job.pk}"


def test_max_runtime_fails_with_reason(world, cluster):
    job = settle(cluster, launch(world, gpu_spec(max_runtime_minutes=1)), JobStatus.RUNNING)
    cluster.advance_clock(90)
    job = settle(cluster, job, JobStatus.FAILED)
    assert job.status_reason == "exceeded the maximum runtime of 1 minutes"


def test_container_exit_code_and_oom(world, cluster):
    job = settle(cluster, launch(world, gpu_spec()), JobStatus.RUNNING)
    (pod,) = live_pods(cluster, job)
    cluster.fail_pod(ns(job), pod["metadata"]["name"], exit_code=137, reason="OOMKilled")
    job = settle(cluster, job, JobStatus.FAILED)
    assert job.exit_code == 137
    assert job.status_reason == "rank 0: out of memory (OOMKilled), exit code 137"


def test_dispatch_twice_creates_one_job_per_tier(world, cluster):
    spec = gpu_spec(nodes=2, spot_ratio=Decimal("0.5"))
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=spec)
    backend = get_backend("kubernetes")
    backend.submit(job)  # a first task that died before recording its success
    services.job_dispatch(job=job)
    services.job_dispatch(job=job)
    job.refresh_from_db()
    assert job.status == JobStatus.PROVISIONING
    names = sorted(j["metadata"]["name"] for j in cluster.list("jobs", ns(job)))
    assert names == [f"gg-{job.pk}-a1", f"gg-{job.pk}-a1-spot"]


def test_apiserver_errors_during_dispatch_are_retried(world, cluster, settings):
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=gpu_spec())
    cluster.fail_next("POST", r"/jobs$", status=500, times=None, message="etcd leader changed")
    job = services.job_dispatch(job=job)
    assert job.status == JobStatus.DISPATCHING and job.dispatch_after > timezone.now()
    assert job.status_reason.startswith("retrying:") and "etcd leader changed" in job.status_reason

    # A create that times out on our side but still happens: the retry finds it (409).
    cluster.clear_faults()
    settings.KUBERNETES_REQUEST_TIMEOUT = 1
    cluster.delay_next("POST", r"/jobs$", seconds=1.5)
    job = services.job_dispatch(job=job)
    assert job.status == JobStatus.DISPATCHING and job.status_reason.startswith("retrying:")
    job = services.job_dispatch(job=job)
    assert job.status == JobStatus.PROVISIONING
    assert [j["metadata"]["name"] for j in cluster.list("jobs", ns(job))] == [f"gg-{job.pk}-a1"]


def test_invalid_object_fails_the_job_with_the_api_message(world, cluster):
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=gpu_spec())
    message = 'Job.batch "x" is invalid: metadata.labels: Invalid value: "a b": must be valid'
    cluster.fail_next("POST", r"/jobs$", status=422, message=message)
    job = services.job_dispatch(job=job)
    assert job.status == JobStatus.FAILED
    assert job.status_reason.startswith("dispatch failed: creating Job")
    assert message in job.status_reason


@pytest.mark.django_db(transaction=True)
def test_concurrent_dispatch_creates_one_job(world, cluster):
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=gpu_spec())
    run_at_once(lambda: services.job_dispatch(job=Job.objects.get(pk=job.pk)), timeout=30)
    job.refresh_from_db()
    assert job.status == JobStatus.PROVISIONING
    assert job.events.filter(to_status=JobStatus.PROVISIONING).count() == 1
    assert [j["metadata"]["name"] for j in cluster.list("jobs", ns(job))] == [f"gg-{job.pk}-a1"]


def test_watch_delivers_events_and_survives_410(kube_api):
    changed: queue.Queue[int] = queue.Queue()
    stop = threading.Event()
    thread = threading.Thread(
        target=watch_jobs,
        kwargs={
            "api_client": kube_api.api_client(),
            "stop_event": stop,
            "on_change": changed.put,
            "timeout_seconds": 1,
            "max_backoff": 0.2,
        },
        daemon=True,
    )
    kube_api.add_node("n1", labels=H100)

    def managed_job(job_id: int) -> dict:
        labels = {**manifests.managed_labels(), "gpugeek.io/job": str(job_id)}
        return {
            "metadata": {"name": f"gg-{job_id}-a1", "labels": labels},
            "spec": {
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox:1"}],
                    },
                }
            },
        }

    def wait_for(job_id: int) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if changed.get(timeout=0.2) == job_id:
                    return
            except queue.Empty:
                continue
        raise AssertionError(f"no event for job {job_id}")

    def job_lists() -> list:
        return [
            r
            for r in list(kube_api.requests)
            if r.path == "/apis/batch/v1/jobs" and r.query.get("watch") not in ("true", "1", "True")
        ]

    kube_api.create("jobs", managed_job(1), namespace="default")  # before: found by the list
    thread.start()
    try:
        wait_for(1)
        kube_api.create("jobs", managed_job(2), namespace="default")  # seen by the watch
        wait_for(2)
        # An unrelated object moves the cluster past the watcher's last job event, then
        # the history is forgotten: the next watch request (the open one ends within its
        # 1 s timeout) gets 410 Gone and the watcher lists again. On a slow host the job
        # controller may still change job 2 after the expiry (the watcher then resumes
        # from that newer version, which is fine): expire again until the re-list shows.
        deadline = time.monotonic() + 20
        for attempt in itertools.count():
            if len(job_lists()) >= 2 or time.monotonic() > deadline:
                break
            name = f"unrelated-{attempt}"
            kube_api.create("configmaps", {"metadata": {"name": name}}, namespace="default")
            kube_api.expire_watch_history()
            settle = time.monotonic() + 2.5
            while len(job_lists()) < 2 and time.monotonic() < settle:
                time.sleep(0.1)
        kube_api.create("jobs", managed_job(3), namespace="default")
        wait_for(3)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(job_lists()) >= 2  # listed again after the 410


def test_the_watcher_and_dispatch_are_counted_for_metrics(world, cluster, settings):
    """Issue 17: the watch's events and the watcher's passes (run_watcher's own functions)
    and the dispatch latency, read back through /metrics."""
    settings.METRICS_TOKEN = TOKEN
    before, started_at = scrape(), time.time()
    stop = threading.Event()
    changed: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
    assert start_watches(stop, changed) == ["kubernetes"]
    try:
        job = launch(world, gpu_spec())
        reported: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 10
        while ("kubernetes", job.pk) not in reported and time.monotonic() < deadline:
            reported |= next_changes(changed, timeout=0.5)
        assert ("kubernetes", job.pk) in reported
        observe_pass("changed", {"kubernetes": {job.pk}})
    finally:
        stop.set()
    after = scrape()

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("gpugeek_watcher_events_total", backend="kubernetes") >= 1
    last_event = value(after, "gpugeek_watcher_last_event_timestamp_seconds", backend="kubernetes")
    assert started_at <= last_event <= time.time()
    assert delta("gpugeek_watcher_pass_duration_seconds_count", kind="changed") == 1
    last_pass = value(after, "gpugeek_watcher_last_pass_timestamp_seconds", kind="changed")
    assert started_at <= last_pass <= time.time()
    assert delta("gpugeek_dispatch_latency_seconds_count", backend="kubernetes") == 1
    assert 0 <= delta("gpugeek_dispatch_latency_seconds_sum", backend="kubernetes") < 10


def test_pending_reasons_and_unpullable_image(world, cluster):
    namespace = f"gg-t-{world.tenant.pk}"
    # The console's namespace (made by this installation earlier), with a quota added.
    labels = manifests.managed_labels()
    cluster.create("namespaces", {"metadata": {"name": namespace, "labels": labels}})
    cluster.create(
        "resourcequotas",
        {"metadata": {"name": "blocker"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}},
        namespace=namespace,
    )
    job = launch(world, gpu_spec())
    cluster.tick()
    backend = get_backend("kubernetes")
    observation = backend.observe(job)
    assert observation.phase == "pending"
    assert observation.reason.startswith("can't create pods:")
    assert "exceeded quota: blocker" in observation.reason

    cluster.delete("resourcequotas", namespace, "blocker")
    cluster.set_node_ready("h100-od-1", False)
    cluster.tick()
    observation = backend.observe(job)
    assert observation.phase == "pending"
    assert "rank 0 unschedulable: 0/3 nodes" in observation.reason

    (pod,) = live_pods(cluster, job)

    def unpullable(p: dict) -> None:
        p["status"]["containerStatuses"] = [
            {
                "name": "main",
                "image": p["spec"]["containers"][0]["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "waiting": {
                        "reason": "ErrImagePull",
                        "message": "rpc error: manifest unknown: manifest tagged 2.5 not found",
                    }
                },
            }
        ]

    with cluster.paused():
        cluster.mutate("pods", namespace, pod["metadata"]["name"], unpullable)
        services.jobs_observe(backend_name="kubernetes")
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.status_reason.startswith("image can't be pulled: rank 0: ErrImagePull")


def test_private_image_pulls_with_the_tenants_registry_login(
    world, cluster, django_capture_on_commit_callbacks
):
    AllowedRegistry.objects.create(host="registry.example.com:5000")
    image_create(
        tenant=world.tenant,
        slug="private-trainer",
        reference="registry.example.com:5000/acme/trainer:1.0",
        user=world.admin,
        name="Trainer",
        kind="framework",
        compatible_with=["nvidia", "cpu"],
    )
    registry_credential_set(
        tenant=world.tenant,
        user=world.admin,
        registry="registry.example.com:5000",
        username="robot",
        password="first-token",
    )
    job = launch(world, gpu_spec(image="private-trainer"))
    name = manifests.registry_secret_name("registry.example.com:5000")
    secret = cluster.get("secrets", ns(job), name)
    assert secret["type"] == "kubernetes.io/dockerconfigjson"

    def login(secret: dict) -> dict:
        config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
        return config["auths"]["registry.example.com:5000"]

    assert (login(secret)["username"], login(secret)["password"]) == ("robot", "first-token")
    kube_job = cluster.get("jobs", ns(job), f"gg-{job.pk}-a1")
    assert kube_job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": name}]
    job = settle(cluster, job, JobStatus.RUNNING)
    (pod,) = live_pods(cluster, job)
    assert pod["spec"]["imagePullSecrets"] == [{"name": name}]

    # A new token replaces the Secret (409 on create) for the next launch.
    registry_credential_set(
        tenant=world.tenant,
        user=world.admin,
        registry="registry.example.com:5000",
        username="robot",
        password="second-token",
    )
    cpu = {"gpu_type": None, "gpus_per_node": 0, "cpus": 1}
    second = launch(world, gpu_spec(name="again", image="private-trainer", **cpu))
    assert login(cluster.get("secrets", ns(second), name))["password"] == "second-token"
    # Public images carry no pull secret; the login's Secret outlives single jobs.
    public = launch(world, gpu_spec(name="public", image="python-3.11", **cpu))
    public_job = cluster.get("jobs", ns(public), f"gg-{public.pk}-a1")
    assert "imagePullSecrets" not in public_job["spec"]["template"]["spec"]
    services.job_cancel(job=job, actor=SYSTEM)
    tasks.job_cancel_task.apply(args=[job.pk])
    assert cluster.get("secrets", ns(job), name) is not None

    # Removing the login removes its copy from the namespace (after commit, by a task).
    credential = RegistryCredential.objects.get(tenant=world.tenant)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        registry_credential_delete(credential=credential, user=world.admin)
    assert callbacks
    tasks.registry_pull_secret_remove_task.apply(args=[world.tenant.pk, credential.registry])
    assert cluster.get("secrets", ns(job), name) is None
    tasks.registry_pull_secret_remove_task.apply(args=[world.tenant.pk, credential.registry])


# --- Kueue ---------------------------------------------------------------------------------


@pytest.fixture
def kueue(cluster, settings):
    """Kueue and JobSet installed, with the platform's ClusterQueue; KUEUE=on."""
    cluster.install_kueue()
    cluster.install_jobset()
    cluster.create(
        "clusterqueues", {"metadata": {"name": "gpu-cluster-queue"}, "spec": {"cohort": "all"}}
    )
    settings.KUEUE = "on"
    settings.KUEUE_QUEUE_NAME = "gpugeek"
    settings.KUEUE_CLUSTER_QUEUE = "gpu-cluster-queue"
    kubernetes_client.API_GROUPS_CACHE.clear()
    yield cluster
    kubernetes_client.API_GROUPS_CACHE.clear()


def workloads(cluster, job: Job) -> list[dict]:
    return cluster.list("workloads", ns(job))


def test_kueue_admits_a_job_it_queued_and_pause_goes_through_its_workload(world, kueue):
    kueue.kueue_admits = False
    job = launch(world, gpu_spec())
    local_queue = kueue.get("localqueues", ns(job), "gpugeek")
    assert local_queue["spec"] == {"clusterQueue": "gpu-cluster-queue"}
    kube_job = kueue.get("jobs", ns(job), f"gg-{job.pk}-a1")
    assert kube_job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpugeek"
    assert kube_job["spec"]["suspend"] is True

    # Held by Kueue: still provisioning, with Kueue's own reason on the job, no pods.
    for _ in range(3):
        kueue.tick()
        services.jobs_observe(backend_name="kubernetes")
    job.refresh_from_db()
    assert job.status == JobStatus.PROVISIONING
    assert job.status_reason == (
        "waiting for Kueue admission: couldn't assign flavors to pod set main: "
        "insufficient unused quota"
    )
    assert live_pods(kueue, job) == []

    kueue.kueue_admits = True
    job = settle(kueue, job, JobStatus.RUNNING)
    (workload,) = workloads(kueue, job)
    assert workload["spec"]["queueName"] == "gpugeek"

    # Kueue owns `suspend`: a pause deactivates the Workload, and Kueue suspends the Job.
    job = services.job_pause(job=job, actor=SYSTEM)
    tasks.job_suspend_task(job.pk)
    (workload,) = workloads(kueue, job)
    assert workload["spec"]["active"] is False
    job = settle(kueue, job, JobStatus.PAUSED)
    assert live_pods(kueue, job) == []

    job = services.job_resume(job=job, actor=SYSTEM)
    tasks.job_resume_task(job.pk)
    job = settle(kueue, job, JobStatus.RUNNING)
    (pod,) = live_pods(kueue, job)
    assert pod["metadata"]["annotations"]["gpugeek.io/resumed"] == "1"
    kueue.succeed_job(ns(job), f"gg-{job.pk}-a1")
    assert settle(kueue, job, JobStatus.SUCCEEDED).exit_code == 0


def test_kueue_admits_both_tiers_of_a_split_job_together_as_one_jobset(world, kueue):
    kueue.kueue_admits = False
    job = launch(world, gpu_spec(nodes=2, spot_ratio=Decimal("0.5")))
    jobset = kueue.get("jobsets", ns(job), f"gg-{job.pk}-a1")
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpugeek"
    kueue.tick()
    tier_jobs = {j["metadata"]["name"]: j for j in kueue.list("jobs", ns(job))}
    assert set(tier_jobs) == {f"gg-{job.pk}-a1-od-0", f"gg-{job.pk}-a1-spot-0"}
    assert all(j["spec"]["suspend"] for j in tier_jobs.values())
    # One Workload for both tiers: Kueue admits them all or nothing.
    (workload,) = workloads(kueue, job)
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [
        ("od", 1),
        ("spot", 1),
    ]
    services.jobs_observe(backend_name="kubernetes")
    job.refresh_from_db()
    assert (job.status, job.status_reason.split(":")[0]) == (
        JobStatus.PROVISIONING,
        "waiting for Kueue admission",
    )
    assert live_pods(kueue, job) == []

    kueue.kueue_admits = True
    job = settle(kueue, job, JobStatus.RUNNING)
    on_demand = kueue.job_pods(ns(job), f"gg-{job.pk}-a1-od-0")
    spot = kueue.job_pods(ns(job), f"gg-{job.pk}-a1-spot-0")
    assert [p["spec"]["nodeName"] for p in on_demand + spot] == ["h100-od-1", "h100-spot-1"]
    env = {e["name"]: e.get("value") for e in spot[0]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == f"gg-{job.pk}-a1-od-0-0.gg-{job.pk}"
    assert on_demand[0]["spec"]["hostname"] == f"gg-{job.pk}-a1-od-0-0"

    kueue.succeed_job(ns(job), f"gg-{job.pk}-a1-od-0")
    job = settle(kueue, job, JobStatus.RUNNING)
    kueue.succeed_job(ns(job), f"gg-{job.pk}-a1-spot-0")
    assert settle(kueue, job, JobStatus.SUCCEEDED, JobStatus.FAILED).status == JobStatus.SUCCEEDED


def test_cancelling_a_kueue_jobset_removes_it_and_its_jobs(world, kueue):
    job = settle(
        kueue, launch(world, gpu_spec(nodes=2, spot_ratio=Decimal("0.5"))), JobStatus.RUNNING
    )
    job = services.job_cancel(job=job, actor=SYSTEM)
    tasks.job_cancel_task(job.pk)
    kueue.tick()
    assert kueue.list("jobsets", ns(job)) == []
    assert kueue.list("jobs", ns(job)) == []
    assert live_pods(kueue, job) == []
    settle(kueue, job, JobStatus.CANCELLED)


def test_our_admission_still_holds_the_tenant_quota_before_kueue(world, kueue):
    TenantQuota.objects.create(tenant=world.tenant, max_concurrent_jobs=1)
    first = launch(world, gpu_spec(gpus_per_node=0, gpu_type=None, cpus=1, image="python-3.11"))
    second = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=gpu_spec(name="second", gpus_per_node=0, gpu_type=None, cpus=1, image="python-3.11"),
    )
    assert (second.status, second.status_reason) == (
        JobStatus.QUEUED,
        "quota: at most 1 jobs at once",
    )
    assert [j["metadata"]["name"] for j in kueue.list("jobs", ns(first))] == [f"gg-{first.pk}-a1"]


def test_kueue_auto_follows_api_discovery(world, cluster, settings):
    settings.KUEUE = "auto"
    kubernetes_client.API_GROUPS_CACHE.clear()
    backend = get_backend("kubernetes")
    assert backend.kueue_queue() is None
    job = launch(world, gpu_spec())
    labels = cluster.get("jobs", ns(job), f"gg-{job.pk}-a1")["metadata"]["labels"]
    assert "kueue.x-k8s.io/queue-name" not in labels

    cluster.install_kueue()
    kubernetes_client.API_GROUPS_CACHE.clear()  # the cache's lifetime, passed
    assert get_backend("kubernetes").kueue_queue() == settings.KUEUE_QUEUE_NAME
    kubernetes_client.API_GROUPS_CACHE.clear()


def test_an_s3_store_reaches_the_pod_as_its_prefix_with_credentials_from_the_secret(
    world, cluster, settings
):
    settings.CHECKPOINT_STORE_URL = "s3://ckpt-bucket/gpugeek"
    settings.CHECKPOINT_STORE_ENDPOINT = "https://minio.example:9000"
    settings.CHECKPOINT_STORE_JOB_ACCESS_KEY_ID = "job-key"
    settings.CHECKPOINT_STORE_JOB_SECRET_ACCESS_KEY = "job-secret"
    job = settle(cluster, launch(world, gpu_spec()), JobStatus.RUNNING)
    (pod,) = live_pods(cluster, job)
    env = {entry["name"]: entry for entry in pod["spec"]["containers"][0]["env"]}
    prefix = f"s3://ckpt-bucket/gpugeek/{job.tenant_id}/{job.pk}/"
    assert env["GPUGEEK_CHECKPOINT_URL"]["value"] == prefix
    assert env["AWS_ENDPOINT_URL"]["value"] == "https://minio.example:9000"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[name]  # never in the Job object itself
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": f"gg-{job.pk}-env", "key": name}
    secret = cluster.get("secrets", ns(job), f"gg-{job.pk}-env")
    stored = secret.get("stringData") or {
        key: base64.b64decode(value).decode() for key, value in secret["data"].items()
    }
    assert stored == {"AWS_ACCESS_KEY_ID": "job-key", "AWS_SECRET_ACCESS_KEY": "job-secret"}
