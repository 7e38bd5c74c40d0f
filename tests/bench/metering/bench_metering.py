"""Metering tick time for 100 / 1,000 / 10,000 running jobs (target: 10,000 in < 1 s on
PostgreSQL). Prints figures; asserts only that the ledger was written.

Half the jobs are 8-GPU H100 jobs with one of two nodes on spot (two records per
interval), half 4-vCPU CPU jobs. Each size meters a first tick (creating the jobs' meters),
then ticks 30 s apart (the production interval) across a midnight: steady ticks inside an
hour, and the day's first tick, which also writes the meters' closed hour into the hourly
and daily job rollups and the closed day into the monthly ones (the most work a tick
does; an hour's first tick does all of it but the day).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.metering import meter_tick, tick
from billing.models import LiveUsageRollup, UsageRecord, UsageRollup
from console.gc_tuning import tune_garbage_collector
from jobs.actors import BACKEND
from jobs.models import Job, JobEvent, JobStatus
from marketplace.models import GpuType, Image, NodePool, Region
from tests.bench.results import bench_size, record

SIZES = [100, 500] if bench_size() == "smoke" else [100, 1_000, 10_000]
STEADY_TICKS = 5
INTERVAL = timedelta(seconds=30)


def create_running_jobs(world, count: int, since) -> None:
    """`count` running jobs and their `running` events, in a few bulk inserts."""
    region = Region.objects.get(slug="us-west")
    h100 = GpuType.objects.get(slug="h100-80gb")
    gpu_image = Image.objects.get(slug="pytorch-2-5-cuda12-4", tenant=None)
    cpu_image = Image.objects.get(slug="python-3.11", tenant=None)
    pools = {
        (p.gpu_type_id, p.tier): p
        for p in NodePool.objects.filter(region=region, backend="kubernetes")
    }
    jobs = []
    for n in range(count):
        gpu = n % 2 == 0
        jobs.append(
            Job(
                tenant=world.tenant,
                created_by=world.member,
                name=f"bench-{n:05d}",
                project=f"p{n % 7}",
                image=gpu_image if gpu else cpu_image,
                image_reference="bench",
                command=["python", "train.py"],
                gpu_type=h100 if gpu else None,
                gpus_per_node=8 if gpu else 0,
                cpus=26 if gpu else 4,
                nodes=2 if gpu else 1,
                region=region,
                spot_ratio=Decimal("0.5") if gpu else Decimal(0),
                backend="kubernetes",
                pool=pools[(h100.pk if gpu else None, "on_demand")],
                spot_pool=pools[(h100.pk, "spot")] if gpu else None,
                on_demand_nodes=1,
                spot_nodes=1 if gpu else 0,
                status=JobStatus.RUNNING,
                status_changed_at=since,
                created_at=since - timedelta(minutes=1),
                started_at=since,
            )
        )
    Job.objects.bulk_create(jobs, batch_size=2_000)
    ids = list(Job.objects.filter(tenant=world.tenant).values_list("pk", flat=True))
    JobEvent.objects.bulk_create(
        [
            JobEvent(
                job_id=pk,
                at=since,
                from_status=JobStatus.PROVISIONING,
                to_status=JobStatus.RUNNING,
                actor_kind=BACKEND.kind,
                attempt=1,
            )
            for pk in ids
        ],
        batch_size=2_000,
    )


def timed_tick(now) -> tuple[float, float, int]:
    """Wall-clock seconds (commit included: each tick commits, as in production, so the
    deferred foreign-key checks and PostgreSQL's HOT updates of the meters and rollups
    behave as they do there), this process's CPU seconds, and the number of queries."""
    with CaptureQueriesContext(connection) as queries:
        started, cpu = time.perf_counter(), time.process_time()
        meter_tick(now=now)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return elapsed, cpu, len(queries.captured_queries)


@contextmanager
def timed_steps():
    """The transactions a tick takes, each timed: (step, seconds) in order."""
    steps: list[tuple[str, float]] = []
    originals = {"tick": tick._tick, "rollup move": tick._release_pending_hours}

    def timed(name, step):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                steps.append((name, time.perf_counter() - started))

        return run

    attributes = {"tick": "_tick", "rollup move": "_release_pending_hours"}
    try:
        for name, step in originals.items():
            setattr(tick, attributes[name], timed(name, step))
        yield steps
    finally:
        for name, step in originals.items():
            setattr(tick, attributes[name], step)


@pytest.mark.parametrize("count", SIZES, ids=lambda n: f"{n}-jobs")
def test_metering_tick_time(committed_bench_world, count):
    world = committed_bench_world
    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    # The day's first tick comes 15 s after midnight.
    since = midnight - INTERVAL * (STEADY_TICKS + 2) + timedelta(seconds=15)
    started = time.perf_counter()
    create_running_jobs(world, count, since)
    setup = time.perf_counter() - started
    tune_garbage_collector()  # as in the worker (console/celery.py)

    first, _, first_queries = timed_tick(since + INTERVAL)
    steady, steady_cpu = [], []
    for n in range(2, STEADY_TICKS + 2):
        seconds, cpu, queries = timed_tick(since + INTERVAL * n)
        steady.append(seconds)
        steady_cpu.append(cpu)
    with timed_steps() as steps:
        day_first, _, day_first_queries = timed_tick(since + INTERVAL * (STEADY_TICKS + 2))
    records = UsageRecord.objects.filter(tenant=world.tenant).count()
    # 1.5 records per job per tick (GPU jobs have an on-demand and a spot record), twice
    # that in the day's first (it is cut at midnight).
    assert records == count * 3 // 2 * (STEADY_TICKS + 3)
    assert UsageRollup.objects.filter(tenant=world.tenant, bucket="month").exists()
    assert LiveUsageRollup.objects.filter(tenant=world.tenant, bucket_start=midnight).exists()

    record(
        "metering",
        f"steady metering tick, {count:,} running jobs ({queries} statements)",
        statistics.median(steady) * 1000,
        "ms",
    )
    print(
        f"\n[bench metering] {connection.vendor}, {count:>6,} running jobs: "
        f"first tick {first * 1000:8.1f} ms ({first_queries} statements), "
        f"steady tick median {statistics.median(steady) * 1000:8.1f} ms / "
        f"max {max(steady) * 1000:8.1f} ms ({queries} statements, "
        f"{statistics.median(steady_cpu) * 1000:.0f} ms CPU in Python), "
        f"{statistics.median(steady) / count * 1e6:6.1f} µs per job; "
        f"a day's first tick {day_first * 1000:8.1f} ms ({day_first_queries} statements: "
        f"{' + '.join(f'{name} {seconds * 1000:.0f} ms' for name, seconds in steps)}); "
        f"setup {setup:.1f} s"
    )
