"""Ledger invariants under any sequence of lifecycle events, price changes and ticks.

A hypothesis rule-based state machine drives two jobs (a 2-vCPU CPU job and a 2-node
H100 job with one node on spot) through start, pause, resume,
preemption (a new attempt), finish, price-book changes and metering ticks (on time,
duplicated, missed), while time moves forward by random amounts. The test keeps its own
model of each job's billed time (running, then pausing or cancelling until the backend
reports the work gone; queueing, paused and resuming time are free) and, after every step,
checks the ledger against it:

- each record's amount is quantize(seconds × unit price / 3600, 1e-9), its unit price
  that of the price version in force at its start (less the tenant's discount), and the
  database's Σ amount equals the exact Decimal sum;
- a job's records cover exactly its billed time up to the last tick, per attempt and
  tier: no overlap, no gap, never across an hour boundary or a price change;
- no (job_ref, attempt, tier, interval_start) twice; every money value is a Decimal;
- the hourly and daily rollups equal the sums of the records, and `rollups_rebuild`
  (checked at teardown, after a final tick) reproduces them.

Each example runs inside a savepoint that teardown rolls back, so examples share only the
catalog and the tenant.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Sum
from django.test import override_settings
from django.urls import reverse
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from billing.metering import meter_tick, rollup_marks, rollups_rebuild
from billing.models import (
    AMOUNT_QUANTUM,
    UsageDailyTotal,
    UsageRecord,
)
from billing.selectors import price_gaps
from jobs.models import Job, JobStatus
from jobs.services import JobSpec, job_submit
from marketplace.models import PriceEntry, PriceVersion, TenantPricing
from tests.billing.conftest import live_rollups, make_job, set_status
from tests.conftest import signed_in_client
from tests.factories import MembershipFactory, UserFactory
from tests.jobs_helpers import at_time

SECONDS_QUANTUM = Decimal("0.001")
HUNDRED = Decimal(100)
DISCOUNT = Decimal("12.50")
BILLED = {JobStatus.RUNNING, JobStatus.PAUSING, JobStatus.CANCELLING}
ROLLUP_FIELDS = ("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount")


def cpu_job(world, *, name: str):
    """2 vCPUs on the demo Kubernetes CPU pool in us-west (whatever this host's size)."""
    with override_settings(COMPUTE_BACKENDS=["kubernetes"]):
        return job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=JobSpec(
                name=name, image="python-3.11", command=["true"], cpus=2, region="us-west"
            ),
        )


def gpu_job(world, *, name: str):
    """2 × 1 H100 in us-west, one node on spot: two tiers, so two records per interval."""
    with override_settings(COMPUTE_BACKENDS=["kubernetes"]):
        return job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=JobSpec(
                name=name,
                image="pytorch-2-5-cuda12-4",
                command=["python", "train.py"],
                nodes=2,
                gpus_per_node=1,
                gpu_type="h100-80gb",
                region="us-west",
                spot_ratio=Decimal("0.5"),
            ),
        )


def merged(intervals) -> list[tuple[datetime, datetime]]:
    """Sorted, non-empty intervals with touching ones joined."""
    out: list[list[datetime]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            assert start == out[-1][1], f"overlap at {start} (previous ends {out[-1][1]})"
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


class ModelJob:
    """What the test knows about one job: its status, attempt and billed spans."""

    def __init__(self, job, units: dict[str, int]):
        self.job = job
        self.units = units  # tier -> GPUs (or vCPUs) on that tier
        self.status = JobStatus.QUEUED
        self.attempt = job.attempt
        self.spans: list[list] = []  # [start, end | None, attempt]

    def move(self, to: str, at: datetime, attempt: int | None = None) -> None:
        was_billed = self.status in BILLED
        set_status(self.job, to, at, attempt=attempt)
        if attempt:
            self.attempt = attempt
        if to in BILLED and not was_billed:
            self.spans.append([at, None, self.attempt])
        elif to not in BILLED and was_billed:
            self.spans[-1][1] = at
        self.status = to

    def billed_until(self, until: datetime | None) -> dict[tuple[int, str], list]:
        """Expected coverage per (attempt, tier) up to `until` (the last tick)."""
        if until is None:
            return {}
        by_attempt: dict[int, list] = defaultdict(list)
        for start, end, attempt in self.spans:
            end = until if end is None else min(end, until)
            if end > start:
                by_attempt[attempt].append((start, end))
        return {
            (attempt, tier): merged(spans)
            for attempt, spans in by_attempt.items()
            for tier in self.units
            if merged(spans)
        }


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self, world, start: datetime, job_ids: list[int]):
        super().__init__()
        self.world = world
        self.now = start
        self.last_tick: datetime | None = None
        # Everything this example writes is rolled back at teardown.
        self.atomic = transaction.atomic()
        self.atomic.__enter__()
        cpu, gpu = (Job.objects.select_related("pool").get(pk=pk) for pk in job_ids)
        self.jobs = [ModelJob(cpu, {"on_demand": 2}), ModelJob(gpu, {"on_demand": 1, "spot": 1})]
        self.versions = list(PriceVersion.objects.order_by("effective_from", "pk"))
        self.prices = {
            (e.version_id, e.gpu_type_id, e.region_id): e.on_demand_price
            for e in PriceEntry.objects.all()
        }

    # --- time and ticks ---

    @rule(seconds=st.integers(min_value=1, max_value=3 * 3600), micros=st.integers(0, 999_999))
    def time_passes_without_a_tick(self, seconds, micros):
        """Time moves on; no tick runs (a missed tick is caught up by the next one)."""
        self.now += timedelta(seconds=seconds, microseconds=micros)

    @rule(hours=st.integers(min_value=20, max_value=30))
    def a_night_passes(self, hours):
        """Long enough for days to close (rolled into months) between two ticks."""
        self.now += timedelta(hours=hours)

    @rule()
    def tick(self):
        meter_tick(now=self.now)
        self.last_tick = self.now

    @rule()
    def duplicate_tick(self):
        """A retried or doubly delivered tick: the same tick twice writes nothing twice."""
        meter_tick(now=self.now)
        meter_tick(now=self.now)
        self.last_tick = self.now

    @rule(
        factor=st.sampled_from(["0.5", "0.913", "1", "1.25", "2", "3.7"]),
        spot_discount=st.sampled_from(["30", "55", "70"]),
    )
    def price_change(self, factor, spot_discount):
        """A new price-book version effective now, with other prices."""
        current = self.versions[-1]
        version = PriceVersion.objects.create(
            currency="USD",
            effective_from=self.now,
            spot_discount_percent=Decimal(spot_discount),
            reserved_1m_discount_percent=current.reserved_1m_discount_percent,
            reserved_3m_discount_percent=current.reserved_3m_discount_percent,
            reserved_12m_discount_percent=current.reserved_12m_discount_percent,
        )
        entries = [
            PriceEntry(
                version=version,
                gpu_type_id=e.gpu_type_id,
                region_id=e.region_id,
                on_demand_price=(e.on_demand_price * Decimal(factor)).quantize(Decimal("0.000001")),
            )
            for e in current.entries.all()
        ]
        PriceEntry.objects.bulk_create(entries)
        self.versions.append(version)
        self.prices.update(
            {(version.pk, e.gpu_type_id, e.region_id): e.on_demand_price for e in entries}
        )

    # --- the job lifecycle ---

    def _with(self, *statuses: str) -> list[ModelJob]:
        return [job for job in self.jobs if job.status in statuses]

    def _pick(self, index: int, *statuses: str) -> ModelJob:
        candidates = self._with(*statuses)
        return candidates[index % len(candidates)]

    @precondition(lambda self: self._with(JobStatus.QUEUED, JobStatus.RESUMING))
    @rule(index=st.integers(0, 1))
    def start(self, index):
        """Queued (a first or a new attempt) or resuming → running."""
        self._pick(index, JobStatus.QUEUED, JobStatus.RESUMING).move(JobStatus.RUNNING, self.now)

    @precondition(lambda self: self._with(JobStatus.RUNNING))
    @rule(index=st.integers(0, 1))
    def pause(self, index):
        self._pick(index, JobStatus.RUNNING).move(JobStatus.PAUSING, self.now)

    @precondition(lambda self: self._with(JobStatus.PAUSING))
    @rule(index=st.integers(0, 1))
    def suspended(self, index):
        """The backend released the compute of a pausing job."""
        self._pick(index, JobStatus.PAUSING).move(JobStatus.PAUSED, self.now)

    @precondition(lambda self: self._with(JobStatus.PAUSED))
    @rule(index=st.integers(0, 1))
    def resume(self, index):
        self._pick(index, JobStatus.PAUSED).move(JobStatus.RESUMING, self.now)

    @precondition(lambda self: self._with(JobStatus.RUNNING))
    @rule(index=st.integers(0, 1))
    def preempt(self, index):
        """Spot capacity reclaimed: the attempt ends and the job queues as a new attempt."""
        job = self._pick(index, JobStatus.RUNNING)
        job.move(JobStatus.PREEMPTED, self.now)
        job.move(JobStatus.QUEUED, self.now, attempt=job.attempt + 1)

    @precondition(lambda self: self._with(JobStatus.RUNNING, JobStatus.PAUSING))
    @rule(index=st.integers(0, 1))
    def cancel(self, index):
        """A cancel: the work still runs (billed) until the backend reports it gone."""
        self._pick(index, JobStatus.RUNNING, JobStatus.PAUSING).move(JobStatus.CANCELLING, self.now)

    @precondition(lambda self: self._with(JobStatus.CANCELLING))
    @rule(index=st.integers(0, 1))
    def cancelled(self, index):
        """The backend reported the cancelled job's work gone."""
        self._pick(index, JobStatus.CANCELLING).move(JobStatus.CANCELLED, self.now)

    @precondition(
        lambda self: self._with(
            JobStatus.RUNNING, JobStatus.PAUSING, JobStatus.QUEUED, JobStatus.PAUSED
        )
    )
    @rule(index=st.integers(0, 1), outcome=st.sampled_from([JobStatus.SUCCEEDED, JobStatus.FAILED]))
    def finish(self, index, outcome):
        """Ends at its real time: succeeded or failed if it held compute, else cancelled."""
        job = self._pick(
            index, JobStatus.RUNNING, JobStatus.PAUSING, JobStatus.QUEUED, JobStatus.PAUSED
        )
        job.move(outcome if job.status in BILLED else JobStatus.CANCELLED, self.now)

    # --- invariants ---

    def _records(self) -> list[UsageRecord]:
        return list(
            UsageRecord.objects.filter(tenant=self.world.tenant)
            .select_related("gpu_type", "region")
            .order_by("pk")
        )

    def _version_at(self, at: datetime) -> PriceVersion | None:
        found = None
        for version in self.versions:  # sorted by (effective_from, pk)
            if version.effective_from <= at:
                found = version
        return found

    @invariant()
    def ledger_is_consistent(self):
        records = self._records()
        self.check_amounts(records)
        self.check_coverage(records)
        assert self._rollups() == self._rollups_from(records)
        assert self._totals() == self._totals_from(records)

    def check_amounts(self, records: list[UsageRecord]) -> None:
        """Exact Decimal amounts at the price in force, never across an hour or a change."""
        by_pk = {v.pk: v for v in self.versions}
        change_points = {v.effective_from for v in self.versions}
        for r in records:
            for value in (r.amount, r.on_demand_amount, r.unit_price, r.gpu_seconds):
                assert isinstance(value, Decimal), (r, value)
            assert isinstance(r.cpu_seconds, Decimal)
            seconds = r.gpu_seconds if r.gpu_type_id else r.cpu_seconds
            assert (r.cpu_seconds if r.gpu_type_id else r.gpu_seconds) == 0
            expected_seconds = (
                Decimal(str((r.interval_end - r.interval_start).total_seconds())) * r.units
            ).quantize(SECONDS_QUANTUM)
            assert seconds == expected_seconds, r
            assert r.amount == (seconds * r.unit_price / 3600).quantize(AMOUNT_QUANTUM), r
            # The version in force at the interval's start, the tier's price, less discount.
            version = self._version_at(r.interval_start)
            assert r.price_version_id == version.pk, (r, r.price_version_id, version.pk)
            od = self.prices[(version.pk, r.gpu_type_id, r.region_id)]
            spot_discount = by_pk[version.pk].spot_discount_percent
            tier_price = od * (HUNDRED - spot_discount) / HUNDRED if r.tier == "spot" else od
            assert r.unit_price == (tier_price * (HUNDRED - DISCOUNT) / HUNDRED).quantize(
                AMOUNT_QUANTUM
            ), r
            on_demand = od * (HUNDRED - DISCOUNT) / HUNDRED
            assert r.on_demand_amount == (seconds * on_demand / 3600).quantize(AMOUNT_QUANTUM)
            assert (r.discount_percent, r.note, r.currency) == (DISCOUNT, "", "USD")
            next_hour = r.interval_start.replace(minute=0, second=0, microsecond=0) + timedelta(
                hours=1
            )
            assert r.interval_end <= next_hour, r
            assert not any(r.interval_start < p < r.interval_end for p in change_points), r

    def check_coverage(self, records: list[UsageRecord]) -> None:
        """Per job, attempt and tier: exactly the billed time up to the last tick."""
        keys = [(r.job_ref, r.attempt, r.tier, r.interval_start) for r in records]
        assert len(keys) == len(set(keys)), "a (job, attempt, tier, start) twice"
        for job in self.jobs:
            got: dict[tuple[int, str], list] = defaultdict(list)
            for r in records:
                if r.job_ref == job.job.pk:
                    assert (r.job_name, r.project) == (job.job.name, job.job.project)
                    got[(r.attempt, r.tier)].append((r.interval_start, r.interval_end))
            actual = {key: merged(spans) for key, spans in got.items()}
            assert actual == job.billed_until(self.last_tick), (job.job.name, job.spans)

    def _rollups(self) -> dict[tuple, tuple]:
        return live_rollups(tenant=self.world.tenant)

    @staticmethod
    def _rollups_from(records: list[UsageRecord]) -> dict[tuple, tuple]:
        """Hourly and daily rows for every record, monthly rows for the days the mark
        says are rolled (those that closed before the last tick)."""
        days_mark = rollup_marks().monthly
        sums: dict[tuple, list[Decimal]] = {}
        for r in records:
            hour = r.interval_start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
            gpu = r.gpu_type.slug if r.gpu_type_id else "cpu"
            buckets = [("hour", hour), ("day", hour.replace(hour=0))]
            if days_mark is not None and hour.replace(hour=0) < days_mark:
                buckets.append(("month", hour.replace(day=1, hour=0)))
            for bucket, start in buckets:
                row = sums.setdefault(
                    (bucket, start, r.job_ref, gpu, r.tier, r.region.slug), [Decimal(0)] * 4
                )
                for i, field in enumerate(ROLLUP_FIELDS):
                    row[i] += getattr(r, field)
        return {key: tuple(values) for key, values in sums.items()}

    def _totals(self) -> dict[tuple, tuple]:
        return {
            (row.bucket_start, row.gpu_type, row.tier, row.region): tuple(
                getattr(row, f) for f in ROLLUP_FIELDS
            )
            for row in UsageDailyTotal.objects.filter(tenant=self.world.tenant)
        }

    @staticmethod
    def _totals_from(records: list[UsageRecord]) -> dict[tuple, tuple]:
        sums: dict[tuple, list[Decimal]] = {}
        for r in records:
            day = r.interval_start.astimezone(UTC).replace(
                hour=0, minute=0, second=0, microsecond=0
            )
            gpu = r.gpu_type.slug if r.gpu_type_id else "cpu"
            row = sums.setdefault((day, gpu, r.tier, r.region.slug), [Decimal(0)] * 4)
            for i, field in enumerate(ROLLUP_FIELDS):
                row[i] += getattr(r, field)
        return {key: tuple(values) for key, values in sums.items()}

    def teardown(self):
        try:
            if sys.exc_info()[0] is None:  # not after a failure: that one is the report
                self.now += timedelta(seconds=1)
                self.tick()
                self.ledger_is_consistent()
                records = self._records()
                exact = sum((r.amount for r in records), Decimal(0))
                in_database = UsageRecord.objects.filter(tenant=self.world.tenant).aggregate(
                    s=Sum("amount")
                )["s"] or Decimal(0)
                # SQLite's SUM adds REAL values (its last digits drift over many rows);
                # PostgreSQL's numeric sum is exact, and the quantum changes nothing there.
                assert isinstance(in_database, Decimal)
                assert in_database.quantize(AMOUNT_QUANTUM) == exact
                before = self._rollups(), self._totals()
                rollups_rebuild(tenant_id=self.world.tenant.pk)
                assert (self._rollups(), self._totals()) == before
        finally:
            transaction.set_rollback(True)
            self.atomic.__exit__(None, None, None)


def test_ledger_invariants_hold_under_any_lifecycle(world, catalog):
    TenantPricing.objects.create(tenant=world.tenant, discount_percent=DISCOUNT)
    first = PriceVersion.objects.order_by("effective_from").first()
    # A day into the price book, at an odd minute so that hour boundaries fall inside spans.
    start = (first.effective_from + timedelta(days=1)).replace(minute=37, second=11, microsecond=0)
    with at_time(start - timedelta(seconds=5)):  # submitted before the examples' start
        cpu = cpu_job(world, name="cpu-job")
        gpu = gpu_job(world, name="gpu-job")
    assert (gpu.on_demand_nodes, gpu.spot_nodes, gpu.pool.tier) == (1, 1, "on_demand")
    run_state_machine_as_test(
        lambda: LedgerMachine(world, start, [cpu.pk, gpu.pk]),
        settings=hypothesis_settings(stateful_step_count=15, deadline=None),
    )


def test_a_price_book_gap_is_recorded_at_zero_with_the_reason(world, catalog, caplog):
    staff = UserFactory(email="staff@gpugeek.test", is_staff=True)
    MembershipFactory(tenant=world.tenant, user=staff, role="member")
    staff_client = signed_in_client(staff, world.tenant)
    html = staff_client.get(reverse("marketplace:staff_prices")).content.decode()
    assert "Price book" in html and 'data-testid="price-gaps"' not in html  # no gap yet
    first = PriceVersion.objects.order_by("effective_from").first()
    start = first.effective_from - timedelta(minutes=10)
    job = make_job(world, name="early", cpus=1, start=start)
    set_status(job, JobStatus.RUNNING, start)
    meter_tick(now=first.effective_from + timedelta(minutes=5))
    records = list(UsageRecord.objects.filter(job_ref=job.pk).order_by("interval_start"))
    # Intervals are also cut at hour boundaries, so either side may be several records.
    gap = [r for r in records if r.price_version_id is None]
    priced = [r for r in records if r.price_version_id is not None]
    assert (gap[0].interval_start, gap[-1].interval_end) == (start, first.effective_from)
    assert all(r.amount == r.unit_price == 0 for r in gap)
    assert sum(r.cpu_seconds for r in gap) == Decimal("600.000")  # the usage itself is kept
    assert all("no price for CPU in local" in r.note for r in gap)
    assert "price book gap" in caplog.text
    assert priced and all(r.price_version_id == first.pk and r.amount > 0 for r in priced)
    # Staff see it on the price book page, from the noted records.
    (found,) = price_gaps()
    assert (found["gpu_type"], found["region"], found["records"]) == ("cpu", "local", len(gap))
    assert (found["first"], found["last"]) == (start, first.effective_from)
    html = staff_client.get(reverse("marketplace:staff_prices")).content.decode()
    assert 'data-testid="price-gaps"' in html and "no price for CPU in local" in html


def test_a_tick_whose_clock_is_older_than_a_job_end_still_bills_the_tail(world, catalog):
    first = PriceVersion.objects.order_by("effective_from").first()
    start = first.effective_from + timedelta(days=1)
    job = make_job(world, name="racing", cpus=1, start=start)
    set_status(job, JobStatus.RUNNING, start)
    meter_tick(now=start + timedelta(seconds=30))
    # The job ends at +100 s; the next tick read the clock at +60 s and then waited for the
    # job's row lock (held by that transition), so it sees the end with an older `now`.
    set_status(job, JobStatus.SUCCEEDED, start + timedelta(seconds=100))
    meter_tick(now=start + timedelta(seconds=60))
    meter_tick(now=start + timedelta(seconds=200))
    billed = UsageRecord.objects.filter(job_ref=job.pk).aggregate(s=Sum("cpu_seconds"))["s"]
    assert billed == Decimal(100)
