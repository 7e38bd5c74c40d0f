"""Fault injection (issue 15, test 3): PostgreSQL connections dropped during metering ticks
(`pg_terminate_backend` on the tick's own connection, 100 times and more): no usage
interval billed twice or missed, and Σ ledger = Σ running time × price, exactly.

A dozen jobs run, pause, resume, are preempted and requeued, and finish on a fixed
timeline while ticks meter them at increasing clock times, across two hour boundaries
(where a tick is three transactions) and a price change. A second thread, on its own
connection, terminates the ticking connection at a random moment of each tick attempt:
mid-statement, between statements, in the commit, between a round's transactions, or
just after the tick (a miss: the connection is dead but the tick is done). A tick that
fails is retried at the same clock on a new connection, as Celery's retry would do it.

The prices are chosen so that every second costs a whole number of nano-dollars, so the
ledger must match the test's own sum of running seconds × price without any rounding.
"""

from __future__ import annotations

import logging
import queue
import random
import statistics
import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise

import pytest
from django.db import InterfaceError, OperationalError, connection, connections
from django.db.models import Sum
from django.test import override_settings

from billing.metering import meter_tick
from billing.models import LiveUsageRollup, UsageDailyTotal, UsageRecord
from jobs.models import Job, JobStatus
from jobs.services import JobSpec, job_submit
from marketplace.models import GpuType, PriceVersion, Region
from marketplace.pricing import unit_prices
from tests.billing.conftest import T0, make_job, set_status
from tests.factories import PriceEntryFactory, PriceVersionFactory
from tests.faults.helpers import report_counts
from tests.servers import purge_queues

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.timeout(150),
    pytest.mark.django_db(transaction=True),
]

KILLS = 100  # ticks cut short by a terminated connection, at least
MIN_TICKS = 130  # about two hours and ten minutes of clock
TICK_SECONDS = (20, 100)  # random whole seconds between two ticks' clocks
# The kill comes at a random moment within this many typical tick durations: about
# half of the attempts are cut short, the others are killed just after.
KILL_WITHIN = 2.0
BILLED = {JobStatus.RUNNING, JobStatus.PAUSING}
PRICE_CHANGE = T0 + timedelta(minutes=50)
HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("pg_terminate_backend needs PostgreSQL (SQLite has no server connections)")


@pytest.fixture
def no_worker():
    """The jobs here are moved through their timeline by the test; the dispatches their
    submissions queued (after commit: this test commits) are dropped at the end."""
    yield
    purge_queues()


def price_book() -> dict[str, PriceVersion]:
    """Two versions of our own: every price per second is a whole number of nano-dollars
    (3.6 / h = 0.001 / s), so no amount is ever rounded."""
    local, us_west = Region.objects.get(slug="local"), Region.objects.get(slug="us-west")
    h100 = GpuType.objects.get(slug="h100-80gb")
    versions = {}
    for name, effective_from, cpu, gpu, spot_discount in (
        ("first", T0 - timedelta(days=1), "0.036", "3.6", 50),
        ("second", PRICE_CHANGE, "0.072", "7.2", 25),
    ):
        version = PriceVersionFactory(
            effective_from=effective_from, spot_discount_percent=Decimal(spot_discount)
        )
        PriceEntryFactory(version=version, region=local, on_demand_price=Decimal(cpu))
        PriceEntryFactory(
            version=version, region=us_west, gpu_type=h100, on_demand_price=Decimal(gpu)
        )
        versions[name] = version
    return versions


def gpu_job(world) -> Job:
    """2 × 1 H100 in us-west, one node on spot: each interval is two records."""
    with override_settings(COMPUTE_BACKENDS=["kubernetes"]):
        return job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=JobSpec(
                name="train-gpu",
                image="pytorch-2-5-cuda12-4",
                command=["python", "train.py"],
                nodes=2,
                gpus_per_node=1,
                gpu_type="h100-80gb",
                region="us-west",
                spot_ratio=Decimal("0.5"),
            ),
        )


def billed_hour(clock: datetime) -> datetime:
    """The hour holding the last instant a tick at `clock` bills."""
    return (clock - timedelta(microseconds=1)).replace(minute=0, second=0, microsecond=0)


def minutes(m: float) -> datetime:
    return T0 + timedelta(minutes=m)


class Killer(threading.Thread):
    """Terminates a backend on request, after a delay, from its own connection; answers
    whether it did (a backend already gone answers False)."""

    def __init__(self) -> None:
        super().__init__(name="pg-killer", daemon=True)
        self.orders: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()

    def run(self) -> None:
        try:
            with connections["default"].cursor() as cursor:
                while (order := self.orders.get()) is not None:
                    pid, delay = order
                    time.sleep(delay)
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                    self.done.put(cursor.fetchone()[0])
        finally:
            connections["default"].close()

    def kill_later(self, pid: int, delay: float) -> None:
        self.orders.put((pid, delay))

    def stop(self) -> None:
        self.orders.put(None)
        self.join(timeout=10)


def test_terminated_tick_connections_bill_every_second_once(world, catalog, no_worker, caplog):
    caplog.set_level(logging.INFO, logger="billing.metering")
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    versions = price_book()

    # name → (job, units per tier, [(at, status, attempt)]): the timeline of each job.
    cpu_two = make_job(world, name="cpu-two", cpus=2, start=T0)
    cpu_pause = make_job(world, name="cpu-pause", start=T0)
    cpu_short = make_job(world, name="cpu-short", start=T0)
    gpu = gpu_job(world)
    plans = {
        "cpu-two": (cpu_two, {"on_demand": 2}, [(minutes(0), JobStatus.RUNNING, None)]),
        "cpu-pause": (
            cpu_pause,
            {"on_demand": 1},
            [
                (minutes(7.2), JobStatus.RUNNING, None),
                (minutes(31), JobStatus.PAUSING, None),
                (minutes(32.5), JobStatus.PAUSED, None),
                (minutes(58), JobStatus.RESUMING, None),
                (minutes(58.25), JobStatus.RUNNING, None),
            ],
        ),
        "cpu-short": (
            cpu_short,
            {"on_demand": 1},
            [(minutes(20), JobStatus.RUNNING, None), (minutes(21.01), JobStatus.SUCCEEDED, None)],
        ),
        "gpu": (
            gpu,
            {"on_demand": 1, "spot": 1},
            [
                (minutes(3), JobStatus.RUNNING, None),
                (minutes(75), JobStatus.PREEMPTED, None),
                (minutes(75), JobStatus.QUEUED, 2),
                (minutes(80.5), JobStatus.RUNNING, None),
                (minutes(100), JobStatus.SUCCEEDED, None),
            ],
        ),
    }
    for n in range(8):  # more of the same: a tick with more rows to write
        job = make_job(world, name=f"cpu-{n}", start=T0)
        plans[f"cpu-{n}"] = (job, {"on_demand": 1}, [(minutes(n * 4 + 1), JobStatus.RUNNING, None)])
    changes = sorted(
        (at, name, status, attempt)
        for name, (_, _, timeline) in plans.items()
        for at, status, attempt in timeline
    )

    killer = Killer()
    killer.start()
    started = time.monotonic()
    clock = last_tick = T0 + timedelta(seconds=30)
    ticks = kills = missed = hour_round_kills = 0
    tick_seconds: list[float] = [0.03]
    try:
        while kills < KILLS or ticks < MIN_TICKS:
            assert time.monotonic() - started < 100, f"{kills} kills in 100 s (seed {seed})"
            while changes and changes[0][0] <= clock:  # what happened before this tick
                at, name, status, attempt = changes.pop(0)
                set_status(plans[name][0], status, at, attempt=attempt)
            while True:  # the tick at `clock`, retried until it isn't cut short
                connection.ensure_connection()
                pid = connection.connection.info.backend_pid
                killer.kill_later(
                    pid, rng.uniform(0, KILL_WITHIN * statistics.median(tick_seconds))
                )
                began = time.monotonic()
                try:
                    meter_tick(now=clock)
                except (OperationalError, InterfaceError):
                    terminated = killer.done.get(timeout=10)
                    assert terminated, "the tick failed, but not from the terminated connection"
                    connection.close()
                    kills += 1
                    # The first tick of an hour is three transactions: cut between them?
                    hour_round_kills += billed_hour(clock) > billed_hour(last_tick)
                    continue
                tick_seconds.append(time.monotonic() - began)
                if killer.done.get(timeout=10):
                    connection.close()  # terminated just after the tick: dead, so drop it
                    missed += 1
                break
            ticks += 1
            last_tick = clock
            clock += timedelta(seconds=rng.randint(*TICK_SECONDS))
    finally:
        killer.stop()
    seconds = time.monotonic() - started

    # The test's own account: billed spans per job and attempt, up to the last tick.
    spans: dict[str, list[tuple[datetime, datetime, int]]] = defaultdict(list)
    for name, (_, _, timeline) in plans.items():
        attempt, opened = 1, None
        for at, status, new_attempt in (change for change in timeline if change[0] <= last_tick):
            attempt = new_attempt or attempt
            if status in BILLED and opened is None:
                opened = (at, attempt)
            elif status not in BILLED and opened is not None:
                spans[name].append((opened[0], at, opened[1]))
                opened = None
        if opened is not None:
            spans[name].append((opened[0], last_tick, opened[1]))
    expected_total = Decimal(0)
    expected_by_job: dict[int, Decimal] = {}
    for name, (job, units, _) in plans.items():
        amount = Decimal(0)
        for start, end, _attempt in spans[name]:
            cuts = [start, *(p for p in (PRICE_CHANGE,) if start < p < end), end]
            for a, b in pairwise(cuts):
                version = versions["second" if a >= PRICE_CHANGE else "first"]
                entry = version.entries.get(gpu_type=job.gpu_type, region=job.region)
                prices = unit_prices(entry, version)
                for tier, count in units.items():
                    price = prices.on_demand if tier == "on_demand" else prices.spot
                    ran = Decimal((b - a) // timedelta(microseconds=1)) / 1_000_000
                    amount += ran * count * price / 3600
        expected_by_job[job.pk] = amount
        expected_total += amount

    # Coverage: per job, attempt and tier, records end to end over exactly the spans.
    lost = doubled = 0
    problems = []
    records = list(UsageRecord.objects.order_by("job_ref", "attempt", "tier", "interval_start"))
    by_key: dict[tuple, list[UsageRecord]] = defaultdict(list)
    for record in records:
        by_key[(record.job_ref, record.attempt, record.tier)].append(record)
    for name, (job, units, _) in plans.items():
        for attempt in sorted({a for _, _, a in spans[name]}):
            want = [(s, e) for s, e, a in spans[name] if a == attempt]
            for tier in units:
                got = by_key.pop((job.pk, attempt, tier), [])
                covered = merge((r.interval_start, r.interval_end) for r in got)
                for a, b in pairwise(got):
                    if b.interval_start < a.interval_end:
                        doubled += 1
                        problems.append(f"{name} a{attempt} {tier}: overlap at {b.interval_start}")
                if covered != merge(want):
                    lost += 1
                    problems.append(
                        f"{name} a{attempt} {tier}: {length(covered)} s in {len(covered)} "
                        f"pieces, not {length(merge(want))} s from {want[0][0]:%H:%M:%S}"
                    )
    doubled += sum(len(rows) for rows in by_key.values())  # records of nothing that ran
    repaired = sum("existed already" in r.getMessage() for r in caplog.records)
    ledger_total = sum((r.amount for r in records), Decimal(0))
    report_counts(
        "pg-terminate",
        trials=kills,
        lost=lost,
        doubled=doubled,
        repaired_by_unique_key=repaired,
        kills_in_an_hours_first_tick=hour_round_kills,
        ticks=ticks,
        kills_after_the_tick=missed,
        records=len(records),
        ledger=ledger_total,
        expected=expected_total,
        seconds=seconds,
        seed=seed,
    )
    assert kills >= KILLS
    assert (lost, doubled, repaired) == (0, 0, 0), "\n".join(problems)
    assert ledger_total == expected_total
    for job_pk, amount in expected_by_job.items():
        assert sum(r.amount for r in records if r.job_ref == job_pk) == amount, job_pk
    # The rollups the Cost Explorer reads hold the same, once: a retried tick added nothing.
    for bucket in ("hour", "day"):
        rolled = LiveUsageRollup.objects.filter(bucket=bucket).aggregate(total=Sum("amount"))
        assert rolled["total"] == ledger_total, bucket
    assert UsageDailyTotal.objects.aggregate(total=Sum("amount"))["total"] == ledger_total


def length(intervals) -> float:
    return sum((end - start).total_seconds() for start, end in intervals)


def merge(intervals) -> list[tuple[datetime, datetime]]:
    """Sorted intervals with touching ones joined."""
    out: list[list[datetime]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]
