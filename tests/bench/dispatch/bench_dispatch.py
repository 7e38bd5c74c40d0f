"""Dispatch benchmark: launches per second from the API to a Kubernetes Job, and whether
the length of the admission queue slows a launch down (it shouldn't: a launch's admission
pass looks at its own pools only and stops where they are full, `jobs.services.jobs_admit`).

For each queue length (1, 100, 1,000 jobs already waiting for other GPUs), jobs are
submitted one after another through `POST /api/v1/jobs` (DRF with an API token; the real
services, commit and enqueue included), and their p50/p99 latency recorded; then a small
pool of threads each runs a dispatch sweep in-process (`jobs_dispatch_task.apply`), as
several Celery workers would, until the simulated API server holds every job's Kubernetes
Job (the sweeps claim disjoint batches). A last row does the same with one sweep in one
thread (as one worker drains what an admission pass admitted). The two phases are timed apart, so
the API latency isn't inflated by dispatch threads fighting it for the GIL (in production
they are separate processes). It prints a table and asserts only that each launch got its
one Kubernetes Job, never anything about time.

Run it on purpose (the file name keeps it out of the default suite):

    .venv/bin/python -m pytest tests/bench/dispatch/bench_dispatch.py -s -p no:cacheprovider

`GPUGEEK_BENCH_JOBS` (default 100) launches per queue length, `GPUGEEK_BENCH_DISPATCHERS`
(default 4) dispatch threads; submitting stops after `GPUGEEK_BENCH_SECONDS` (default 40)
per queue length, so a slow machine still finishes in a few minutes.

Reading the figures: the simulated API server runs in its own process (`python -m
sandbox`) with its controllers idle, so no pods are made; the embedded default is SQLite, where each
write transaction takes the database lock (set DATABASE_URL to measure PostgreSQL).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from kubernetes import client as k8s

from console.launcher import free_loopback_port, wait_for_http
from jobs import services, tasks
from jobs.backends.kubernetes import KubernetesBackend
from jobs.models import Job, JobStatus
from jobs.services import JobSpec
from marketplace.demo import seed_catalog
from marketplace.models import NodePool
from marketplace.services import capacity_sync
from tests.bench.results import record
from tests.conftest import token_client
from tests.servers import purge_queues, stop_process_group

pytestmark = pytest.mark.timeout(900)

QUEUE_LENGTHS = (1, 100, 1000)
JOBS_PER_RUN = int(os.environ.get("GPUGEEK_BENCH_JOBS", "100"))
DISPATCHERS = int(os.environ.get("GPUGEEK_BENCH_DISPATCHERS", "4"))
SECONDS_PER_RUN = float(os.environ.get("GPUGEEK_BENCH_SECONDS", "40"))
US_WEST = {"topology.kubernetes.io/region": "us-west"}
H100 = {**US_WEST, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
A100 = {**US_WEST, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
BIG_NODE = {"nvidia.com/gpu": "64", "cpu": "1024", "memory": "16Ti", "pods": "5000"}
LAUNCH = {
    "image": "pytorch-2-5-cuda12-4",
    "command": ["python", "train.py"],
    "gpu_type": "h100-80gb",
    "gpus_per_node": 1,
    "cpus": 4,
    "region": "us-west",
}


@dataclass
class Run:
    queued: int
    batched: bool = False
    submit_seconds: list[float] = field(default_factory=list)
    job_ids: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    submit_phase: float = 0.0
    dispatch_phase: float = 0.0

    def rate(self, seconds: float) -> float:
        return len(self.job_ids) / seconds if seconds > 0 else float("nan")


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile, in milliseconds."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(pct / 100 * len(ordered))))
    return ordered[rank - 1] * 1000


class SandboxProcess:
    """The simulated Kubernetes API server in its own process (`python -m sandbox`), as in
    production where the API server is another machine: the benchmark's figures don't
    share its GIL. Its controllers tick once an hour: Jobs only, no pods."""

    def __init__(self, directory, nodes: list[dict]):
        self.port = free_loopback_port()
        (directory / "nodes.json").write_text(json.dumps(nodes))
        (directory / "token").write_text("bench-token")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "--port", str(self.port), "--tick", "3600",
             "--nodes", str(directory / "nodes.json"), "--token-file", str(directory / "token")],
            start_new_session=True,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for_http(f"{self.url}/version")
        self.kubeconfig = directory / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "b", "cluster": {"server": self.url}}],
                    "users": [{"name": "b", "user": {"token": "bench-token"}}],
                    "contexts": [{"name": "b", "context": {"cluster": "b", "user": "b"}}],
                    "current-context": "b",
                }
            )
        )
        configuration = k8s.Configuration(host=self.url)
        configuration.api_key = {"BearerToken": "bench-token"}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        self.api_client = k8s.ApiClient(configuration)

    def job_names(self, namespace: str) -> set[str]:
        listed = k8s.BatchV1Api(self.api_client).list_namespaced_job(namespace)
        return {item.metadata.name for item in listed.items}

    def stop(self) -> None:
        self.api_client.close()
        stop_process_group(self.process)


@contextmanager
def simulated_cluster(settings, directory, nodes: list[dict]) -> Iterator[SandboxProcess]:
    """The demo catalog with its pools replaced by `nodes` in a simulated API server of
    its own process, which this process's settings point at."""
    seed_catalog()
    NodePool.objects.filter(slug__startswith="demo-").update(is_active=False)
    sandbox = SandboxProcess(directory, nodes)
    try:
        capacity_sync(backend=KubernetesBackend(sandbox.api_client))
        settings.COMPUTE_BACKENDS = ["kubernetes"]
        settings.KUBECONFIG = str(sandbox.kubeconfig)
        purge_queues()
        yield sandbox
    finally:
        purge_queues()  # the dispatches job_submit enqueued; nobody consumed them
        sandbox.stop()


@pytest.fixture
def cluster(transactional_db, settings, tmp_path):
    """Plenty of H100s for the launches (16 nodes × 64 GPUs), and one A100 node that a
    running job fills, so the jobs queued for it stay queued in front of ours."""
    nodes = [{"name": f"h100-{n}", "labels": H100, "allocatable": BIG_NODE} for n in range(16)]
    nodes.append({"name": "a100-0", "labels": A100})
    with simulated_cluster(settings, tmp_path, nodes) as sandbox:
        yield sandbox


def fill_queue(template: Job, length: int) -> None:
    """Grow the admission queue to `length` jobs waiting for the full A100 node (bulk rows,
    as if submitted earlier), then let admission record their reasons once."""
    have = Job.objects.filter(status=JobStatus.QUEUED).count()
    rows = []
    for number in range(have, length):
        row = copy.copy(template)
        row.pk = None
        row.name = f"waiting-{number}"
        row.status = JobStatus.QUEUED
        row.status_reason = ""
        row.created_at = row.status_changed_at = timezone.now()
        rows.append(row)
    Job.objects.bulk_create(rows, batch_size=500)
    services.jobs_admit()
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == length


def a100_blocker(world) -> Job:
    """A job holding all 8 A100 GPUs; returned as the template for the waiting jobs."""
    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=JobSpec(name="a100-holder", **{**LAUNCH, "gpu_type": "a100-80gb", "gpus_per_node": 8}),
    )
    assert job.status == JobStatus.DISPATCHING, job.status_reason
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)  # setup, not under test
    return Job.objects.get(pk=job.pk)


def submit_all(client, run: Run) -> None:
    """Launch through the API, one request after another, nothing else running here."""
    started = time.perf_counter()
    for number in range(JOBS_PER_RUN):
        if time.perf_counter() - started > SECONDS_PER_RUN:
            break
        payload = {**LAUNCH, "name": f"bench-q{run.queued}-{number}"}
        before = time.perf_counter()
        response = client.post("/api/v1/jobs", payload, format="json")
        run.submit_seconds.append(time.perf_counter() - before)
        if response.status_code != 201 or response.data["status"] != JobStatus.DISPATCHING:
            run.errors.append(f"submit {number}: {response.status_code} {response.data}")
            continue
        run.job_ids.append(response.data["id"])
    run.submit_phase = time.perf_counter() - started


def dispatch_all(run: Run) -> None:
    """Run a dispatch sweep in each of DISPATCHERS threads, as that many workers would."""
    lock = threading.Lock()

    def dispatcher() -> None:
        try:
            result = tasks.jobs_dispatch_task.apply()
            if result.failed():
                with lock:
                    run.errors.append(f"sweep: {result.result!r}")
        finally:
            connection.close()

    threads = [threading.Thread(target=dispatcher, daemon=True) for _ in range(DISPATCHERS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    run.dispatch_phase = time.perf_counter() - started


def dispatch_batched(run: Run) -> None:
    """One dispatch sweep in this one thread (batches of DISPATCH_BATCH_SIZE), as one
    worker would drain a backlog (the Kubernetes creates of a batch overlap in its
    threads)."""
    started = time.perf_counter()
    result = tasks.jobs_dispatch_task.apply()
    if result.failed():
        run.errors.append(f"sweep: {result.result!r}")
    run.dispatch_phase = time.perf_counter() - started
    connection.close()


@pytest.fixture
def quiet_task_log():
    """Celery logs every eager task run at INFO; that would bury the table under -s."""
    trace_log = logging.getLogger("celery.app.trace")
    level = trace_log.level
    trace_log.setLevel(logging.WARNING)
    yield
    trace_log.setLevel(level)


def test_dispatch_throughput_and_submit_latency_by_queue_length(cluster, world, quiet_task_log):
    client = token_client(world.owner, world.tenant)
    template = a100_blocker(world)
    client.post("/api/v1/jobs", {**LAUNCH, "name": "warm-up"}, format="json")  # imports, caches
    services.job_dispatch(job=Job.objects.get(name="warm-up"))

    runs = []
    for length in QUEUE_LENGTHS:
        fill_queue(template, length)
        run = Run(queued=length)
        submit_all(client, run)
        dispatch_all(run)
        runs.append(run)
    batched = Run(queued=QUEUE_LENGTHS[-1], batched=True)
    submit_all(client, batched)
    dispatch_batched(batched)
    runs.append(batched)

    print()
    print(
        f"dispatch benchmark: API submit → Kubernetes Job created in the sandbox API server "
        f"({connection.vendor}; up to {JOBS_PER_RUN} launches or {SECONDS_PER_RUN:.0f} s of "
        f"submitting per row; {DISPATCHERS} dispatch threads)"
    )
    header = (
        f"{'dispatch':>8} {'queued':>7} {'jobs':>5} {'submit p50':>11} {'submit p99':>11} "
        f"{'submit/s':>9} {'dispatch/s':>10} {'end-to-end/s':>12}"
    )
    print(header)
    print("-" * len(header))
    for run in runs:
        p50, p99 = percentile(run.submit_seconds, 50), percentile(run.submit_seconds, 99)
        print(
            f"{'batched' if run.batched else 'per job':>8} {run.queued:>7} {len(run.job_ids):>5} "
            f"{p50:>9.1f}ms {p99:>9.1f}ms "
            f"{run.rate(run.submit_phase):>9.1f} {run.rate(run.dispatch_phase):>10.1f} "
            f"{run.rate(run.submit_phase + run.dispatch_phase):>12.1f}"
        )
    print(
        "submit: the API call alone (mean "
        + ", ".join(f"{statistics.mean(r.submit_seconds) * 1000:.0f}" for r in runs)
        + " ms); dispatch/s: sweeps until the Jobs exist (per job: a sweep in each of "
        f"{DISPATCHERS} threads; batched: one sweep, batches of "
        f"{settings.DISPATCH_BATCH_SIZE} jobs, in one thread); end-to-end/s: launches ÷ "
        "(submitting + dispatching), one after the other"
    )

    for run in runs:
        rate = run.rate(run.dispatch_phase)
        if run.batched:
            record(
                "dispatch",
                f"dispatch to Kubernetes Job, batches of {settings.DISPATCH_BATCH_SIZE} in one "
                "worker thread (API server in its own process)",
                rate,
                "jobs/s",
                target="≥ 500 jobs/s",
                met=rate >= 500,
            )
            continue
        p50 = percentile(run.submit_seconds, 50)
        record(
            "dispatch",
            f"POST /api/v1/jobs p50, {run.queued} queued",
            p50,
            "ms",
            target="< 20 ms",
            met=p50 < 20,
        )
        record(
            "dispatch",
            f"dispatch to Kubernetes Job, a task per job in {DISPATCHERS} threads, "
            f"{run.queued} queued (API server in its own process)",
            rate,
            "jobs/s",
            target="≥ 500 jobs/s",
            met=rate >= 500,
        )

    # Correctness only: every launch admitted, dispatched once, one Kubernetes Job each.
    for run in runs:
        assert not run.errors, run.errors[:5]
        assert run.job_ids, f"nothing launched at queue length {run.queued}"
        statuses = set(Job.objects.filter(pk__in=run.job_ids).values_list("status", flat=True))
        assert statuses == {JobStatus.PROVISIONING}, statuses
    kube_jobs = cluster.job_names(f"gg-t-{world.tenant.pk}")
    expected = {f"gg-{job_id}-a1" for run in runs for job_id in run.job_ids}
    assert expected <= kube_jobs
    assert len(kube_jobs) == len(expected) + 1  # plus the warm-up's
