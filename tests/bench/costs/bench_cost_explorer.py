"""Cost Explorer response time for a tenant with 12 months × 500 jobs of usage (target:
p99 < 200 ms). Prints p50 / p99 per request; asserts only that each answered 200.

The usage is written straight into the daily rollups the explorer reads (one row per job
per day: 365 × 500 = 182,500 rows, over ten GPU types and CPU, two tiers, three regions)
and into the daily totals without the job dimension that metering keeps alongside them
(what the charts read unless they are about jobs); then the closed days are rolled into
monthly job rollups by metering's own `roll_closed_days`, as the first tick of each day
does. Hourly rows are left out, as the explorer never reads them. Then 500 more jobs run
and are metered once, so that their meters hold the running hour, which every read by job
adds to the rollups.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta
from datetime import time as clock
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.metering import meter_tick, roll_closed_days
from billing.models import UsageDailyTotal, UsageRollup
from console.gc_tuning import tune_garbage_collector
from tests.bench.metering.bench_metering import create_running_jobs
from tests.bench.results import bench_size, record
from tests.conftest import signed_in_client, token_client

SMOKE = bench_size() == "smoke"
DAYS = 30 if SMOKE else 365
JOBS = 50 if SMOKE else 500
REQUESTS = 5 if SMOKE else 30
WARM_UP = 2
# A slow case stops early (after at least MIN_REQUESTS), so the benchmark stays bounded.
CASE_BUDGET_S = 20
MIN_REQUESTS = 5
GPU_TYPES = [
    "h100-80gb",
    "h200-141gb",
    "a100-80gb",
    "a100-40gb",
    "l40s",
    "l4",
    "rtx-4090",
    "mi300x",
    "mi250",
    "ascend-910b",
    "cpu",
]
REGIONS = ["us-west", "us-east", "eu-central"]


def seed_rollups(tenant, today) -> int:
    rows = []
    for job in range(JOBS):
        gpu_type = GPU_TYPES[job % len(GPU_TYPES)]
        tier = "spot" if job % 3 == 0 else "on_demand"
        hours = Decimal(1 + job % 8)
        amount = hours * Decimal("2.99") * (Decimal("0.45") if tier == "spot" else 1)
        for day in range(DAYS):
            rows.append(
                UsageRollup(
                    tenant=tenant,
                    bucket="day",
                    bucket_start=datetime.combine(today - timedelta(days=day), clock.min, UTC),
                    job_ref=1_000_000 + job,
                    job_name=f"job-{job:03d}",
                    project=f"project-{job % 10}",
                    gpu_type=gpu_type,
                    tier=tier,
                    region=REGIONS[job % len(REGIONS)],
                    gpu_seconds=Decimal(0) if gpu_type == "cpu" else hours * 3600,
                    cpu_seconds=hours * 3600 if gpu_type == "cpu" else Decimal(0),
                    amount=amount.quantize(Decimal("0.000000001")),
                    on_demand_amount=(hours * Decimal("2.99")).quantize(Decimal("0.000000001")),
                    currency="USD",
                )
            )
    UsageRollup.objects.bulk_create(rows, batch_size=5_000)
    totals: dict[tuple, UsageDailyTotal] = {}
    for row in rows:
        key = (row.bucket_start, row.gpu_type, row.tier, row.region)
        total = totals.get(key)
        if total is None:
            totals[key] = UsageDailyTotal(
                tenant=tenant,
                bucket_start=row.bucket_start,
                gpu_type=row.gpu_type,
                tier=row.tier,
                region=row.region,
                gpu_seconds=row.gpu_seconds,
                cpu_seconds=row.cpu_seconds,
                amount=row.amount,
                on_demand_amount=row.on_demand_amount,
                currency=row.currency,
            )
        else:
            for field in ("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount"):
                setattr(total, field, getattr(total, field) + getattr(row, field))
    UsageDailyTotal.objects.bulk_create(totals.values(), batch_size=5_000)
    roll_closed_days(None, timezone.now())
    return len(rows)


def run_jobs_this_hour(world) -> None:
    """JOBS jobs running since a few minutes ago, metered once: their meters hold the
    running hour, which every read by job adds to the rollups."""
    now = timezone.now()
    since = max(now - timedelta(minutes=5), now.replace(minute=0, second=0, microsecond=0))
    create_running_jobs(world, JOBS, since)
    meter_tick(now=now)
    if connection.vendor == "postgresql":
        # Statistics, as autovacuum keeps them for tables this size: plans for freshly
        # bulk-loaded tables assume they are empty.
        with connection.cursor() as cursor:
            cursor.execute(
                "ANALYZE billing_usagerollup, billing_usagedailytotal, billing_jobmeter, jobs_job"
            )


def percentiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return statistics.median(samples), cuts[98]


@pytest.fixture
def tenant_with_a_year(bench_world):
    today = timezone.now().astimezone(UTC).date()
    started = time.perf_counter()
    count = seed_rollups(bench_world.tenant, today)
    run_jobs_this_hour(bench_world)
    print(
        f"\n[bench costs] {connection.vendor}: {count:,} daily rollup rows "
        f"({DAYS} days × {JOBS} jobs) and "
        f"{UsageDailyTotal.objects.filter(tenant=bench_world.tenant).count():,} daily totals, "
        f"{UsageRollup.objects.filter(bucket='month').count():,} monthly rollups "
        f"written in {time.perf_counter() - started:.1f} s"
    )
    return bench_world, today


def test_cost_explorer_response_time(tenant_with_a_year):
    world, today = tenant_with_a_year
    tune_garbage_collector()  # as the web process does (console/asgi.py)
    year_ago = (today - timedelta(days=DAYS - 1)).isoformat()
    page = signed_in_client(world.member, world.tenant)
    api = token_client(world.member, world.tenant)
    cases = [
        ("page: this month by GPU type", page, "/billing/costs/", {}, {}),
        (
            "page: last 30 days by tier (htmx)",
            page,
            "/billing/costs/",
            {"range": "last_30_days", "group_by": "tier"},
            {"HTTP_HX_REQUEST": "true"},
        ),
        (
            "page: last 90 days by job (500 jobs)",
            page,
            "/billing/costs/",
            {"range": "last_90_days", "group_by": "job"},
            {},
        ),
        (
            "page: 12 months by GPU type",
            page,
            "/billing/costs/",
            {"range": "custom", "start": year_ago, "end": today.isoformat()},
            {},
        ),
        (
            "CSV: 12 months by job",
            page,
            "/billing/costs/export.csv",
            {"range": "custom", "start": year_ago, "end": today.isoformat(), "group_by": "job"},
            {},
        ),
        (
            "API usage: 12 months by job",
            api,
            "/api/v1/usage",
            {"start": year_ago, "end": today.isoformat(), "group_by": "job"},
            {},
        ),
        (
            "API usage: 12 months by day",
            api,
            "/api/v1/usage",
            {"start": year_ago, "end": today.isoformat(), "group_by": "day"},
            {},
        ),
        ("API costs summary", api, "/api/v1/costs/summary", {}, {}),
    ]
    lines = []
    for name, client, url, params, headers in cases:
        samples: list[float] = []
        case_started = time.perf_counter()
        for n in range(WARM_UP + REQUESTS):
            if len(samples) >= MIN_REQUESTS and time.perf_counter() - case_started > CASE_BUDGET_S:
                break
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.get(url, params, **headers)
                elapsed = time.perf_counter() - started
            assert response.status_code == 200, (name, response.status_code)
            if n >= WARM_UP:
                samples.append(elapsed * 1000)
        p50, p99 = percentiles(samples)
        record("costs", f"Cost Explorer: {name} p99 (p50 {p50:.0f} ms)", p99, "ms")
        lines.append(
            f"  {name:<42} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  n={len(samples):<2} "
            f"({len(queries.captured_queries)} queries, {len(response.content) / 1024:.0f} KiB)"
        )
    print(
        f"\n[bench costs] {connection.vendor}: Cost Explorer, up to {REQUESTS} requests each "
        f"(Django test client, in-process):\n" + "\n".join(lines)
    )
