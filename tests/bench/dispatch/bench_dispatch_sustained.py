"""Sustained dispatch: a backlog of accepted jobs (10,000 at full size) released at once,
admitted and dispatched by ONE real Celery worker process, until every job's Kubernetes
Job exists in the simulated API server, which runs in a process of its own.

The launches were accepted while their pool had no room (queued rows, as the API leaves
them); room appears and an admission pass runs (`services.jobs_admit`, as after a
capacity change or a finished job): one transaction admits them all and queues one
dispatch sweep (`jobs_dispatch_task`); the worker (`celery worker --pool threads`, one
process) runs it: it claims the rows in batches of DISPATCH_BATCH_SIZE, creates each batch's
Kubernetes objects in KUBERNETES_DISPATCH_CONCURRENCY threads and records them in one
transaction. The clock runs from the admission pass to the last job reaching
`provisioning`; the figure is jobs per second over the whole backlog.

It prints the rate, the admission pass's share and the CPU each process spent per job,
and asserts only correctness: every job dispatched once, one Kubernetes Job each.

    .venv/bin/python -m pytest tests/bench/dispatch/bench_dispatch_sustained.py -s

`GPUGEEK_BENCH_BACKLOG` sets the number of jobs (default 10,000; 500 at the smoke size).
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.utils import timezone

from jobs import services
from jobs.models import Job, JobStatus
from jobs.services import JobSpec
from jobs.services.dispatch import dispatch_sweep_now
from tests.bench.dispatch.bench_dispatch import BIG_NODE, H100, LAUNCH, simulated_cluster
from tests.bench.results import bench_size, record
from tests.servers import ROOT, child_env, purge_queues, stop_process_group, wait_until

pytestmark = pytest.mark.timeout(1800)

DEFAULT_BACKLOG = "500" if bench_size() == "smoke" else "10000"
BACKLOG = int(os.environ.get("GPUGEEK_BENCH_BACKLOG", DEFAULT_BACKLOG))
WORKER_THREADS = 2  # one batch's database work overlaps the other's API calls
GPUS_PER_NODE = int(BIG_NODE["nvidia.com/gpu"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def backlog_cluster(transactional_db, settings, tmp_path):
    """Enough H100 nodes for the whole backlog plus the warm-up job."""
    count = math.ceil((BACKLOG + 1) / GPUS_PER_NODE)
    nodes = [{"name": f"h100-{n}", "labels": H100, "allocatable": BIG_NODE} for n in range(count)]
    with simulated_cluster(settings, tmp_path, nodes) as sandbox:
        yield sandbox


@pytest.fixture
def dispatch_worker(backlog_cluster, tmp_path):
    """One `celery worker` process (thread pool) reaching the same simulated cluster."""
    purge_queues()
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "console", "worker", "-l", "WARNING",
             "--pool", "threads", "--concurrency", str(WORKER_THREADS),
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-n", f"bench-{os.getpid()}@%h"],
            cwd=ROOT,
            env=child_env(
                COMPUTE_BACKENDS="kubernetes", KUBECONFIG=str(backlog_cluster.kubeconfig)
            ),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield process, log_path
    finally:
        stop_process_group(process)


def accepted_backlog(template: Job, count: int, status: str = JobStatus.QUEUED) -> list[int]:
    """`count` accepted launches like `template`, queued (bulk rows, as if submitted
    while their pool was full), or admitted (`status` dispatching)."""
    now = timezone.now()
    rows = []
    for number in range(count):
        row = copy.copy(template)
        row.pk = None
        row.name = f"backlog-{number}"
        row.status = status
        row.status_reason = "waiting for capacity" if status == JobStatus.QUEUED else "admitted"
        row.created_at = row.status_changed_at = now
        rows.append(row)
    return [row.pk for row in Job.objects.bulk_create(rows, batch_size=1000)]


def warmed_up(world, worker_log) -> Job:
    """A launch dispatched by the worker: the tenant's namespace exists and the worker
    has connected everything. (Its launch lists it for a sweep, as every launch does.)"""
    template = services.job_submit(
        tenant=world.tenant, user=world.member, spec=JobSpec(name="warm-up", **LAUNCH)
    )
    assert template.status == JobStatus.DISPATCHING, template.status_reason
    wait_until(
        lambda: Job.objects.filter(pk=template.pk, status=JobStatus.PROVISIONING).exists(),
        60,
        what=f"the warm-up job dispatched by the worker:\n{worker_log.read_text()}",
    )
    return template


def all_provisioning(job_ids: list[int], started: float, worker_log) -> float:
    """Seconds from `started` until every job is `provisioning`."""
    pending = Job.objects.filter(pk__in=job_ids).exclude(status=JobStatus.PROVISIONING)
    while pending.exists():
        assert time.perf_counter() < started + 1200, f"not dispatched:\n{worker_log.read_text()}"
        time.sleep(0.05)
    return time.perf_counter() - started


def dispatched_once(cluster, world, job_ids: list[int]) -> None:
    """Correctness only: each job once, one Kubernetes Job each, no failures."""
    assert not Job.objects.filter(pk__in=job_ids, dispatch_failures__gt=0).exists()
    kube_jobs = cluster.job_names(f"gg-t-{world.tenant.pk}")
    assert {f"gg-{job_id}-a1" for job_id in job_ids} <= kube_jobs
    assert len(kube_jobs) == BACKLOG + 1  # plus the warm-up's


def record_sustained(what: str, rate: float) -> None:
    record(
        "dispatch",
        f"sustained: {what} (API server in its own process)",
        rate,
        "jobs/s",
        target="≥ 500 jobs/s",
        met=rate >= 500,
    )


def test_sustained_dispatch_of_a_backlog_by_one_worker(backlog_cluster, dispatch_worker, world):
    worker, worker_log = dispatch_worker
    template = warmed_up(world, worker_log)
    job_ids = accepted_backlog(template, BACKLOG)

    worker_cpu, sandbox_cpu = cpu_seconds(worker.pid), cpu_seconds(backlog_cluster.process.pid)
    started = time.perf_counter()
    admitted = services.jobs_admit()
    admission = time.perf_counter() - started
    assert len(admitted) == BACKLOG
    elapsed = all_provisioning(job_ids, started, worker_log)
    worker_cpu = cpu_seconds(worker.pid) - worker_cpu
    sandbox_cpu = cpu_seconds(backlog_cluster.process.pid) - sandbox_cpu

    rate = BACKLOG / elapsed
    print()
    print(
        f"sustained dispatch: {BACKLOG:,} accepted jobs, admission pass + one worker process "
        f"({WORKER_THREADS} threads, batches of {settings.DISPATCH_BATCH_SIZE}, "
        f"{settings.KUBERNETES_DISPATCH_CONCURRENCY} create threads) → Kubernetes Jobs"
    )
    print(
        f"  {rate:,.0f} jobs/s ({elapsed:.1f} s; admission pass {admission:.1f} s); CPU per job: "
        f"worker {worker_cpu / BACKLOG * 1000:.2f} ms, API server "
        f"{sandbox_cpu / BACKLOG * 1000:.2f} ms"
    )
    record_sustained(
        f"{BACKLOG:,} accepted jobs admitted and dispatched by one worker process", rate
    )

    dispatched_once(backlog_cluster, world, job_ids)


def test_sustained_dispatch_of_launches_admitted_at_once(backlog_cluster, dispatch_worker, world):
    """Launches into a pool with room: each is admitted in its own transaction and, after
    its commit, queues a dispatch sweep unless one is queued already
    (`dispatch.dispatch_sweep_now`). Here BACKLOG launches commit at once (their rows in
    bulk, as admitted launches leave them; then each one's after-commit hand-over, as the
    API's processes would make them), and the one worker sweeps them; the clock runs
    from the first hand-over to the last job reaching `provisioning`."""
    worker, worker_log = dispatch_worker
    template = warmed_up(world, worker_log)
    job_ids = accepted_backlog(template, BACKLOG, status=JobStatus.DISPATCHING)

    worker_cpu = cpu_seconds(worker.pid)
    started = time.perf_counter()
    for _ in job_ids:
        dispatch_sweep_now()
    handed_over = time.perf_counter() - started
    elapsed = all_provisioning(job_ids, started, worker_log)
    worker_cpu = cpu_seconds(worker.pid) - worker_cpu

    rate = BACKLOG / elapsed
    print()
    print(
        f"launches admitted at once: {BACKLOG:,} hand-overs to dispatch sweeps ("
        f"{handed_over:.1f} s), one worker process → Kubernetes Jobs: {rate:,.0f} jobs/s "
        f"({elapsed:.1f} s); worker CPU per job {worker_cpu / BACKLOG * 1000:.2f} ms"
    )
    record_sustained(
        f"{BACKLOG:,} launches admitted at once, dispatched by sweeps of one worker process", rate
    )
    dispatched_once(backlog_cluster, world, job_ids)
