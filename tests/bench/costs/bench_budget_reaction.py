"""Budget reaction time: from the metering tick that crosses 100 % to the pause of the
scope's running non-critical jobs (target: ≤ 30 s to the backend's suspend call, which is
queued on the pause's commit). Also prints the overspend at the pause, against one
interval's cost of the running jobs. Asserts only that every job was paused.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from billing.budgets.selectors import budget_spend
from billing.budgets.services import budget_create, budget_enforce
from billing.metering import meter_tick
from jobs.actors import ActorKind
from jobs.models import Job, JobEvent, JobStatus
from marketplace.models import Image, NodePool, Region
from tests.bench.results import bench_size, record

SIZES = [10, 50] if bench_size() == "smoke" else [10, 100, 500]
INTERVAL = timedelta(seconds=30)
CPU_PRICE = Decimal("0.0125")  # per vCPU-hour in the demo book


def running_cpu_jobs(world, count: int, since) -> list[int]:
    region = Region.objects.get(slug="us-west")
    pool = NodePool.objects.get(region=region, backend="kubernetes", gpu_type=None)
    image = Image.objects.get(slug="python-3.11", tenant=None)
    Job.objects.bulk_create(
        [
            Job(
                tenant=world.tenant,
                created_by=world.member,
                name=f"bench-{n:04d}",
                image=image,
                image_reference=image.reference,
                command=["python", "train.py"],
                cpus=4,
                region=region,
                backend="kubernetes",
                pool=pool,
                on_demand_nodes=1,
                status=JobStatus.RUNNING,
                status_changed_at=since,
                created_at=since - timedelta(minutes=1),
                started_at=since,
            )
            for n in range(count)
        ]
    )
    ids = list(Job.objects.filter(tenant=world.tenant).values_list("pk", flat=True))
    JobEvent.objects.bulk_create(
        [
            JobEvent(
                job_id=pk,
                at=since,
                from_status="provisioning",
                to_status="running",
                actor_kind=ActorKind.BACKEND,
            )
            for pk in ids
        ]
    )
    return ids


@pytest.mark.parametrize("count", SIZES, ids=lambda n: f"{n}-jobs")
def test_budget_reaction_time(bench_world, count):
    world = bench_world
    now = timezone.now()
    since = now - timedelta(seconds=25)
    ids = running_cpu_jobs(world, count, since)
    per_second = count * 4 * CPU_PRICE / 3600  # the scope's cost per second
    # Exhausted 20 s into the jobs' run; the tick at 30 s is the one that crosses it.
    budget = budget_create(
        tenant=world.tenant,
        user=world.owner,
        name="Bench cap",
        amount=(per_second * 20).quantize(Decimal("0.000001")),
    )
    tick_at = since + INTERVAL

    started = time.perf_counter()
    wall_start = timezone.now()
    meter_tick(now=tick_at)
    ticked = time.perf_counter()
    paused = budget_enforce(tenant=world.tenant, now=tick_at)
    enforced = time.perf_counter()

    assert len(paused) == count
    assert not Job.objects.filter(pk__in=ids).exclude(status=JobStatus.PAUSING).exists()
    reactions = sorted(
        (at - wall_start).total_seconds() * 1000
        for at in JobEvent.objects.filter(job_id__in=ids, to_status=JobStatus.PAUSING).values_list(
            "at", flat=True
        )
    )
    spend = budget_spend(budget, tick_at)
    record(
        "costs",
        f"budget reaction: tick start → last of {count} jobs paused",
        reactions[-1],
        "ms",
    )
    print(
        f"\n[bench budget] {connection.vendor}, {count:>4} running jobs: "
        f"tick {(ticked - started) * 1000:7.1f} ms, enforce {(enforced - ticked) * 1000:8.1f} ms "
        f"({(enforced - ticked) / count * 1000:.1f} ms per paused job); tick start → pause: "
        f"first {reactions[0]:7.1f} ms, median {statistics.median(reactions):7.1f} ms, "
        f"last {reactions[-1]:8.1f} ms; overspend at the pause {spend - budget.amount:.6f} "
        f"= {(spend - budget.amount) / (per_second * 30) * 100:.0f} % of one 30 s interval's "
        f"cost"
    )
