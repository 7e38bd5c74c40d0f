"""Metering: turn jobs' running time into priced, contiguous, unique usage records.

One tick (`meter_tick`) runs in one transaction with the candidate jobs locked, and ticks
take turns, so two ticks can't write the same interval; the unique key (job, attempt,
tier, interval start) backs that up. The number of queries is constant whatever the
number of jobs.

A job is billed from the moment it is running until its compute is released
(`running` and `pausing`); queueing, provisioning and paused time are not billed.
Intervals are split at hour boundaries and at price-version changes, so each record is
priced by the version in force when it ran and rolls up into one hour. A tick adds its
records of the current hour to the jobs' meters (`JobMeter`), which it rewrites anyway;
the first tick of the next hour moves the meters' hours into the hourly and daily job
rollups in one statement, and records of any other hour go to those rows at once.
Daily totals (without the job) grow every tick; monthly job rollups get their days when
the days have closed (`MonthlyRollupMark`).

A tick handles thousands of running jobs, so it works on plain value tuples, never on
model instances, and prices each distinct piece of usage once. On PostgreSQL the records
and meters travel as JSON documents (one parameter each); elsewhere (SQLite, the embedded
default) `executemany` does the same work.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections import Counter, defaultdict, namedtuple
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import F, Min, Q
from django.utils import timezone

from billing.dbviews import METER_ROLLUP
from billing.models import (
    AMOUNT_QUANTUM,
    Bucket,
    HourlyRollupMark,
    JobMeter,
    MonthlyRollupMark,
    UsageDailyTotal,
    UsageRecord,
    UsageRollup,
)
from console.models import Tenant
from jobs.models import Job, JobEvent, JobStatus
from marketplace.models import GpuType, PriceVersion, Region, TenantPricing, Tier
from marketplace.pricing import unit_prices

log = logging.getLogger(__name__)
S = JobStatus
BILLED = frozenset({S.RUNNING, S.PAUSING})
SECONDS_QUANTUM = Decimal("0.001")
MICROSECONDS = Decimal(1_000_000)
HOUR = timedelta(hours=1)
HUNDRED = Decimal(100)
ZERO = Decimal(0)


@dataclass(frozen=True)
class Span:
    start: datetime
    end: datetime
    attempt: int


def billed_spans(events, since: datetime, until: datetime) -> list[Span]:
    """Billed time of one job between `since` and `until`, from its status changes
    (anything with `at`, `to_status` and `attempt`, in time order)."""
    spans: list[Span] = []
    open_at: datetime | None = None
    attempt = 1
    for event in events:
        if event.to_status in BILLED and open_at is None:
            open_at, attempt = event.at, event.attempt
        elif event.to_status not in BILLED and open_at is not None:
            spans.append(Span(open_at, event.at, attempt))
            open_at = None
    if open_at is not None:
        spans.append(Span(open_at, until, attempt))
    clipped = []
    for span in spans:
        start, end = max(span.start, since), min(span.end, until)
        if end > start:
            clipped.append(Span(start, end, span.attempt))
    return clipped


def _split(span: Span, cut_points: list[datetime]) -> list[Span]:
    """Cut a span at hour boundaries and at the given instants (price changes, in time
    order)."""
    next_hour = span.start.replace(minute=0, second=0, microsecond=0) + HOUR
    first = bisect_right(cut_points, span.start)  # the first instant after the start
    if span.end <= next_hour and (first == len(cut_points) or cut_points[first] >= span.end):
        return [span]  # the usual case: a tick's 30 s inside one hour and one price
    points = {p for p in cut_points[first:] if p < span.end}
    while next_hour < span.end:
        points.add(next_hour)
        next_hour += HOUR
    edges = [span.start, *sorted(points), span.end]
    return [Span(a, b, span.attempt) for a, b in pairwise(edges)]


class _Price(NamedTuple):
    version_id: int | None
    currency: str
    unit_price: Decimal  # per unit-hour on this tier, after discount, quantized
    on_demand_price: Decimal  # per unit-hour on demand, after discount (not quantized)
    is_gap: bool  # no entry for this GPU type and region: recorded at zero, with a note


class _PriceBook:
    """Every version, loaded once per tick (a small table), with each (version, GPU type,
    region, tier, discount) priced once."""

    def __init__(self) -> None:
        versions = list(
            PriceVersion.objects.prefetch_related("entries").order_by("effective_from", "pk")
        )
        self.versions = versions
        self.change_points = [v.effective_from for v in versions]
        self.entries = {
            (v.pk, e.gpu_type_id, e.region_id): e for v in versions for e in v.entries.all()
        }
        self.discounts = dict(TenantPricing.objects.values_list("tenant_id", "discount_percent"))
        self._prices: dict[tuple, _Price] = {}

    def price(self, job: _JobRow, tier: str, at: datetime) -> _Price:
        """The price of one unit-hour of `job` on `tier` at `at` (the interval's start)."""
        index = bisect_right(self.change_points, at) - 1
        version = self.versions[index] if index >= 0 else None
        discount = self.discounts.get(job.tenant_id, ZERO)
        key = (version and version.pk, job.gpu_type_id, job.region_id, tier, discount)
        found = self._prices.get(key)
        if found is None:
            found = self._prices[key] = self._price(version, job, tier, discount, at)
        return found

    def _price(self, version, job: _JobRow, tier: str, discount: Decimal, at) -> _Price:
        entry = version and self.entries.get((version.pk, job.gpu_type_id, job.region_id))
        if entry is None:
            # Logged once per tick and price, not once per job: the alert staff act on.
            log.error(
                "price book gap: %s (e.g. job %s); usage recorded at zero",
                gap_note(job, at),
                job.pk,
            )
            currency = version.currency if version else "USD"
            return _Price(version and version.pk, currency, ZERO, ZERO, True)
        prices = unit_prices(entry, version)
        factor = (HUNDRED - discount) / HUNDRED
        return _Price(
            version.pk,
            version.currency,
            (prices.for_tier(tier) * factor).quantize(AMOUNT_QUANTUM),
            prices.on_demand * factor,
            False,
        )


def gap_note(job: _JobRow, at: datetime) -> str:
    what = job.gpu_type__slug or "CPU"
    return f"no price for {what} in {job.region__slug} at {at:%Y-%m-%d %H:%M}"


class _JobRow(NamedTuple):
    """The columns of a job that metering reads (see JOB_COLUMNS)."""

    pk: int
    tenant_id: int
    name: str
    project: str
    status: str
    started_at: datetime | None
    gpu_type_id: int | None
    gpu_type__slug: str | None
    region_id: int
    region__slug: str
    gpus_per_node: int
    cpus: int
    pool__tier: str | None
    on_demand_nodes: int
    spot_nodes: int


JOB_COLUMNS = _JobRow._fields


class _Change(NamedTuple):
    at: datetime
    to_status: str
    attempt: int


class _Piece(NamedTuple):
    """A priced piece of usage: everything of a record but its job's own fields."""

    attempt: int
    tier: str
    gpu_type_id: int | None
    region_id: int
    interval_start: datetime
    interval_end: datetime
    units: int
    gpu_seconds: Decimal
    cpu_seconds: Decimal
    price_version_id: int | None
    unit_price: Decimal
    discount_percent: Decimal
    amount: Decimal
    on_demand_amount: Decimal
    currency: str
    note: str
    # Not stored in the record: what its rollups need.
    hour_start: datetime
    gpu_type: str  # slug, or "cpu"
    region: str  # slug


# One usage record to write: its job's own fields, then its priced piece's (the fields
# after `note` only feed the rollups).
LedgerRow = namedtuple(
    "LedgerRow", ("tenant_id", "job_ref", "job_name", "project", *_Piece._fields)
)


RECORD_COLUMNS = LedgerRow._fields[: LedgerRow._fields.index("note") + 1]


def _tiers(job: _JobRow) -> list[tuple[str, int]]:
    """(tier, units) shares of a job: each node billed at its actual tier."""
    per_node = job.gpus_per_node if job.gpu_type_id else job.cpus
    base_tier = job.pool__tier or Tier.ON_DEMAND
    shares = [(base_tier, job.on_demand_nodes * per_node), (Tier.SPOT, job.spot_nodes * per_node)]
    return [(tier, units) for tier, units in shares if units > 0]


class _Held(NamedTuple):
    """What a meter holds (see `JobMeter`): the hour, its currency, each slot's tier."""

    hour: datetime | None
    currency: str
    tier_1: str
    tier_2: str


NOTHING_HELD = _Held(None, "", "", "")


class _MeterPlan(NamedTuple):
    """What one tick does with a job's usage, given what its meter held: the meter's new
    held state, the sums added to its slots, and the rollup pieces (indices) that go to
    the job's rollup rows at once."""

    held: _Held
    day: datetime | None
    sums: tuple[Decimal, ...]  # slot 1's four sums (ROLLUP_SUMS), then slot 2's
    direct: tuple[int, ...]

    def changes(self, held: _Held) -> bool:
        """Whether the meter that held `held` changes."""
        return self.held != held or any(self.sums)


class _TickLedger:
    """A tick's records as (job, priced piece) charges. A priced piece is everything of a
    ledger row but the job's own fields (tenant, id, name, project): it is computed once
    per tick for each (piece, tier, units, GPU type, region, discount), since most running
    jobs bill the same 30 s at the same price. A big tick prices a handful of pieces and
    charges them ten thousand times; the PostgreSQL writer ships just that.

    The rollups are planned the same way: once per (pieces of a job, what its meter
    held), most jobs sharing a plan. Pieces of the tick's hour go to the meter's slots;
    the rest (another hour, a third tier, another currency) become rollup pieces charged
    to the job's rollup rows directly."""

    def __init__(self, book: _PriceBook, *, hour: datetime, monthly_mark: datetime | None):
        self.book = book
        self.hour = hour  # the tick's hour (UTC): the one meters hold
        self.monthly_mark = monthly_mark
        self.pieces: list[_Piece] = []
        self.charges: list[tuple[_JobRow, int]] = []  # (job, index into `pieces`)
        self._index: dict[tuple, int] = {}
        self._charged: dict[tuple, tuple[list[int], int]] = {}
        self.plans: list[_MeterPlan] = []
        self._plan_index: dict[tuple, int] = {}
        # (bucket, start, GPU type, tier, region, currency, *ROLLUP_SUMS)
        self.rollup_pieces: list[tuple] = []
        self.rollup_charges: list[tuple[_JobRow, int]] = []  # (job, index into the above)
        self._rollup_index: dict[tuple, int] = {}

    def charge(self, job: _JobRow, spans: list[Span], held: _Held) -> int:
        """Charge a job's billed spans; returns the index of its meter's plan. Jobs alike
        in all that prices them, billed the same spans from the same held state (most
        running jobs, each tick), share the work."""
        discount = self.book.discounts.get(job.tenant_id, ZERO)
        per_node = job.gpus_per_node if job.gpu_type_id else job.cpus
        alike = (tuple(spans), held, job.gpu_type_id, job.region_id, job.pool__tier,
                 job.on_demand_nodes, job.spot_nodes, per_node, discount)  # fmt: skip
        charged = self._charged.get(alike)
        if charged is None:
            charged = self._charged[alike] = self._price(job, spans, held, discount)
        pieces, plan = charged
        self.charges.extend([(job, index) for index in pieces])
        direct = self.plans[plan].direct
        if direct:
            self.rollup_charges.extend([(job, index) for index in direct])
        return plan

    def _price(self, job: _JobRow, spans, held: _Held, discount: Decimal) -> tuple:
        """(indices of the job's priced pieces, index of its meter's plan)."""
        tiers = _tiers(job)
        pieces = []
        for span in spans:
            for piece in _split(span, self.book.change_points):
                for tier, units in tiers:
                    key = (piece, tier, units, job.gpu_type_id, job.region_id, discount)
                    index = self._index.get(key)
                    if index is None:
                        index = self._index[key] = len(self.pieces)
                        self.pieces.append(self._tail(job, piece, tier, units, discount))
                    pieces.append(index)
        key = (tuple(pieces), held)
        plan = self._plan_index.get(key)
        if plan is None:
            plan = self._plan_index[key] = len(self.plans)
            self.plans.append(self._plan(*key))
        return pieces, plan

    def rows(self) -> list[LedgerRow]:
        """Every record in full."""
        pieces = self.pieces
        return [
            LedgerRow._make((job.tenant_id, job.pk, job.name, job.project, *pieces[index]))
            for job, index in self.charges
        ]

    @property
    def tenants(self) -> set[int]:
        return {job.tenant_id for job, _ in self.charges}

    def rollups(self) -> dict[tuple, list]:
        """The job rollup rows added to directly, as `_upsert_rollups` takes them."""
        pieces = self.rollup_pieces
        return {
            (job.tenant_id, bucket, start, job.pk, gpu_type, tier, region): [
                job.name, job.project, currency, *sums
            ]
            for job, index in self.rollup_charges
            for bucket, start, gpu_type, tier, region, currency, *sums in (pieces[index],)
        }  # fmt: skip

    def totals(self) -> dict[tuple, list]:
        """This tick's daily totals (tenant × day × GPU type × tier × region), from each
        piece's sums times the number of its charges."""
        sums: dict[tuple, list] = {}
        for (tenant_id, index), count in Counter(
            (job.tenant_id, index) for job, index in self.charges
        ).items():
            p = self.pieces[index]
            key = (tenant_id, p.hour_start.replace(hour=0), p.gpu_type, p.tier, p.region)
            row = sums.setdefault(key, [p.currency, ZERO, ZERO, ZERO, ZERO])
            for i, value in enumerate(_sums_of(p), start=1):
                row[i] += value * count
        return sums

    def _plan(self, pieces: tuple[int, ...], held: _Held) -> _MeterPlan:
        hour, currency, tiers = held.hour, held.currency, [held.tier_1, held.tier_2]
        sums = [ZERO] * 8
        direct: dict[tuple, list[Decimal]] = {}
        for index in pieces:
            p = self.pieces[index]
            slot = None
            fits = hour in (None, self.hour) and currency in ("", p.currency)
            if fits and p.hour_start == self.hour:
                if p.tier in tiers:
                    slot = tiers.index(p.tier)
                elif "" in tiers:
                    slot = tiers.index("")
            if slot is not None:
                hour, currency, tiers[slot] = self.hour, p.currency, p.tier
                for i, value in enumerate(_sums_of(p)):
                    sums[4 * slot + i] += value
                continue
            day = p.hour_start.replace(hour=0)
            buckets = [(Bucket.HOUR, p.hour_start), (Bucket.DAY, day)]
            if self.monthly_mark is not None and day < self.monthly_mark:
                buckets.append((Bucket.MONTH, day.replace(day=1)))  # a day already rolled
            for bucket, start in buckets:
                key = (bucket, start, p.gpu_type, p.tier, p.region, p.currency)
                row = direct.setdefault(key, [ZERO] * 4)
                for i, value in enumerate(_sums_of(p)):
                    row[i] += value
        indices = []
        for key, row in direct.items():
            # One row per key and job: the currency is the first piece's, as in a rollup.
            piece = (*key, *row)
            index = self._rollup_index.get(piece)
            if index is None:
                index = self._rollup_index[piece] = len(self.rollup_pieces)
                self.rollup_pieces.append(piece)
            indices.append(index)
        new_held = _Held(hour, currency, *tiers)
        day = hour.replace(hour=0) if hour is not None else None
        return _MeterPlan(new_held, day, tuple(sums), tuple(indices))

    def _tail(self, job: _JobRow, piece: Span, tier: str, units: int, discount: Decimal):
        start = piece.start
        price = self.book.price(job, tier, start)
        # Exact: a timedelta is a whole number of microseconds.
        seconds = Decimal((piece.end - start) // timedelta(microseconds=1)) / MICROSECONDS
        unit_seconds = (seconds * units).quantize(SECONDS_QUANTUM)
        is_gpu = job.gpu_type_id is not None
        return _Piece(
            piece.attempt,
            tier,
            job.gpu_type_id,
            job.region_id,
            start,
            piece.end,
            units,
            unit_seconds if is_gpu else ZERO,
            ZERO if is_gpu else unit_seconds,
            price.version_id,
            price.unit_price,
            discount,
            (unit_seconds * price.unit_price / 3600).quantize(AMOUNT_QUANTUM),
            (unit_seconds * price.on_demand_price / 3600).quantize(AMOUNT_QUANTUM),
            price.currency,
            gap_note(job, start) if price.is_gap else "",
            start.astimezone(UTC).replace(minute=0, second=0, microsecond=0),
            job.gpu_type__slug if is_gpu else "cpu",
            job.region__slug,
        )


def _sums_of(p) -> tuple[Decimal, Decimal, Decimal, Decimal]:
    return p.gpu_seconds, p.cpu_seconds, p.amount, p.on_demand_amount


class RollupMarks(NamedTuple):
    """How far the meters' hours have moved into the job rollups and the days into the
    monthly ones (`HourlyRollupMark`, `MonthlyRollupMark`); None where no tick has."""

    hourly: datetime | None
    monthly: datetime | None


def rollup_marks() -> RollupMarks:
    return RollupMarks(
        HourlyRollupMark.objects.values_list("rolled_until", flat=True).first(),
        MonthlyRollupMark.objects.values_list("rolled_until", flat=True).first(),
    )


@dataclass
class TickResult:
    jobs: int
    records: int
    tenants: set[int]

    def merged(self, other: TickResult) -> TickResult:
        return TickResult(
            max(self.jobs, other.jobs), self.records + other.records, self.tenants | other.tenants
        )


# Billed now, still being metered, ran and ended before its first tick, or changed
# status since it was last metered (it may have run again between two ticks).
CANDIDATES = (
    Q(status__in=BILLED)
    | Q(meter__open=True)
    | Q(meter__isnull=True, started_at__isnull=False)
    | Q(status_changed_at__gt=F("meter__metered_until"))
)


# Any constant: the key of the PostgreSQL advisory lock that makes ticks take turns.
TICK_LOCK = 0x6767_6D65_7465_72  # "ggmeter"
METER_READ = ("job_id", "metered_until", "open", "hour", "currency", "tier_1", "tier_2")


def meter_tick(*, now: datetime | None = None) -> TickResult:
    """Meter every job up to `now`. The first tick of a new hour first meters up to the
    hour's start (into the hour the meters hold), then moves the meters' hours into the
    job rollups and closed days into months, and then meters the rest: three
    transactions, so that no one of them does an hour's rollup work on top of a tick's."""
    now = now or timezone.now()
    hour = _hour_before(now)
    mark = HourlyRollupMark.objects.values_list("rolled_until", flat=True).first()
    result = TickResult(0, 0, set())
    if mark is None or mark < hour:
        if mark is not None:
            result = _tick(now=hour)
        _release_held_hours(hour)
    return result.merged(_tick(now=now))


def _hour_before(at: datetime) -> datetime:
    """The hour (UTC) holding the last instant before `at`: the hour a tick up to `at`
    bills last, and the one its meters may hold."""
    last = at.astimezone(UTC) - timedelta(microseconds=1)
    return last.replace(minute=0, second=0, microsecond=0)


def _wait_for_turn() -> None:
    """Take turns with every tick and rollup move until this transaction ends, so each
    reads the meters its predecessor committed. (SQLite's immediate transactions already
    serialize every writer.)"""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [TICK_LOCK])


@contextmanager
def _ticks_take_turns():
    """One tick's or rollup move's transaction, in turn with the others."""
    with transaction.atomic():
        _wait_for_turn()
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                # The commit needn't wait for its WAL flush: a crash can only lose the
                # whole transaction, which the next tick then does again from the same
                # meters and marks.
                cursor.execute("SET LOCAL synchronous_commit = off")
        yield


def _tick(*, now: datetime) -> TickResult:
    with _ticks_take_turns():
        return _meter(now=now)


def _meter(*, now: datetime) -> TickResult:
    jobs = _fetch(
        Job.objects.select_for_update(of=("self",)).filter(CANDIDATES).values_list(*JOB_COLUMNS)
    )
    if not jobs:
        return TickResult(0, 0, set())
    # The locked jobs are still candidates in the next statements' snapshots: only a tick
    # changes meters, and the jobs' own rows are locked.
    candidates = Job.objects.filter(CANDIDATES).values("pk")
    meters = {
        job_id: (until, is_open, _Held(*held))
        for job_id, until, is_open, *held in _fetch(
            JobMeter.objects.filter(job__in=candidates).values_list(*METER_READ)
        )
    }
    changes: dict[int, list[_Change]] = defaultdict(list)
    for job_id, *change in _fetch(
        JobEvent.objects.filter(job__in=candidates)
        # Only changes into or out of billed time can open or close a span.
        .filter(Q(to_status__in=BILLED) | Q(from_status__in=BILLED))
        .exclude(from_status=F("to_status"))
        .order_by("job_id", "at", "pk")
        .values_list("job_id", "at", "to_status", "attempt")
    ):
        changes[job_id].append(_Change(*change))

    monthly_mark = MonthlyRollupMark.objects.values_list("rolled_until", flat=True).first()
    ledger = _TickLedger(_PriceBook(), hour=_hour_before(now), monthly_mark=monthly_mark)
    new_meters: list[tuple[int, datetime, bool, int]] = []
    moved_meters: list[tuple[int, datetime, bool, int]] = []
    for job in map(_JobRow._make, jobs):
        events = changes.get(job.pk, ())
        meter = meters.get(job.pk)
        if meter is None:
            since = next((e.at for e in events if e.to_status in BILLED), job.started_at or now)
            held = NOTHING_HELD
        else:
            since, _, held = meter
        still_billed = job.status in BILLED
        # A job that ended after this tick's clock was read (while we waited for its row
        # lock) is billed to its real end, not cut at `now`.
        until = now if still_billed or not events else max(now, events[-1].at)
        plan = ledger.charge(job, billed_spans(events, since, until), held)
        # A job that isn't billed now has nothing left to bill before `until`. A cursor
        # never moves back (a late tick of a concurrent round bills nothing).
        metered_until = max(since, now if still_billed else until)
        if meter is None:
            new_meters.append((job.pk, metered_until, still_billed, plan))
        elif meter[:2] != (metered_until, still_billed) or ledger.plans[plan].changes(held):
            moved_meters.append((job.pk, metered_until, still_billed, plan))

    writer = _PostgresWriter() if use_postgres_bulk_sql() else _PortableWriter()
    writer.meters(ledger.plans, new_meters, moved_meters)
    # The locked rows and the cursor make a duplicate impossible; the unique key is the
    # last line of defence, and only a tick whose records were all new adds to rollups.
    writer.ledger(ledger, created_at=timezone.now())
    return TickResult(len(jobs), len(ledger.charges), ledger.tenants)


def _release_held_hours(hour: datetime) -> None:
    """Move every meter's hour before `hour` into the hourly and daily job rollups, and
    the days closed since into the monthly ones; move the marks."""
    with _ticks_take_turns():
        marks = rollup_marks()
        if marks.hourly is not None and marks.hourly >= hour:
            return  # a concurrent round has done it
        dt = connection.ops.adapt_datetimefield_value
        _move_held_to_rollups("held_hour < %s", [dt(hour)])
        JobMeter.objects.filter(hour__lt=hour).update(**EMPTY_HELD)
        if not HourlyRollupMark.objects.update(rolled_until=hour):
            HourlyRollupMark.objects.create(rolled_until=hour)
        roll_closed_days(marks.monthly, hour)


@transaction.atomic
def release_held_usage(job_ids: list[int]) -> None:
    """Move what these jobs' meters hold into their rollups now (before the jobs and
    their meters are deleted: the job rollups outlive the job)."""
    if not job_ids:
        return
    _wait_for_turn()  # an hour's rollup move would otherwise move them too
    _move_held_to_rollups(f"job_ref IN ({', '.join(['%s'] * len(job_ids))})", job_ids)
    JobMeter.objects.filter(job_id__in=job_ids).update(**EMPTY_HELD)


def _move_held_to_rollups(where: str, params: list) -> None:
    # Each meter is one job and its two slots hold two tiers, so the rows have distinct
    # keys. SQLite needs the WHERE to read ON CONFLICT as the upsert's.
    sql = (
        f"INSERT INTO {ROLLUP_TABLE} ({', '.join(ROLLUP_COLUMNS)}) "  # noqa: S608
        f"SELECT {', '.join(ROLLUP_COLUMNS)} FROM {METER_ROLLUP} WHERE {where} "
        + _upsert(ROLLUP_TABLE, ROLLUP_KEY)
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def roll_closed_days(monthly_mark: datetime | None, now: datetime) -> None:
    """Add the days that closed since the last mark (their daily job rollups) to the
    monthly rollups and move the mark: once a day, one statement per month touched."""
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if monthly_mark is not None and monthly_mark >= today:
        return
    start = monthly_mark
    if start is None:
        start = UsageRollup.objects.filter(bucket=Bucket.DAY, bucket_start__lt=today).aggregate(
            first=Min("bucket_start")
        )["first"]
    dt = connection.ops.adapt_datetimefield_value
    labels = ", ".join(f"min({c})" for c in ROLLUP_LABELS)
    sums = ", ".join(f"sum({c})" for c in ROLLUP_SUMS)
    sql = (
        f"INSERT INTO {ROLLUP_TABLE} ({', '.join(ROLLUP_COLUMNS)}) "  # noqa: S608
        f"SELECT tenant_id, '{Bucket.MONTH}', %s, job_ref, gpu_type, tier, region, {labels}, "
        f"{sums} FROM {ROLLUP_TABLE} "
        f"WHERE bucket = '{Bucket.DAY}' AND bucket_start >= %s AND bucket_start < %s "
        "GROUP BY tenant_id, job_ref, gpu_type, tier, region " + _upsert(ROLLUP_TABLE, ROLLUP_KEY)
    )
    with connection.cursor() as cursor:
        while start is not None and start < today:
            month = start.astimezone(UTC).replace(day=1)
            until = min((month + timedelta(days=32)).replace(day=1), today)
            cursor.execute(sql, [dt(month), dt(start), dt(until)])
            start = until
    if not MonthlyRollupMark.objects.update(rolled_until=today):
        MonthlyRollupMark.objects.create(rolled_until=today)


def use_postgres_bulk_sql() -> bool:
    """Whether the tick writes through PostgreSQL's bulk statements (the fast path) or the portable
    `executemany` statements; tests run both on PostgreSQL and compare them."""
    return connection.vendor == "postgresql"


ROLLUP_KEY = ("tenant_id", "bucket", "bucket_start", "job_ref", "gpu_type", "tier", "region")
ROLLUP_LABELS = ("job_name", "project", "currency")
ROLLUP_SUMS = ("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount")
ROLLUP_COLUMNS = (*ROLLUP_KEY, *ROLLUP_LABELS, *ROLLUP_SUMS)
RECORD_TABLE = UsageRecord._meta.db_table
JOB_TABLE = Job._meta.db_table
ROLLUP_TABLE = UsageRollup._meta.db_table
METER_TABLE = JobMeter._meta.db_table
TOTAL_TABLE = UsageDailyTotal._meta.db_table
GPU_TYPE_TABLE = GpuType._meta.db_table
REGION_TABLE = Region._meta.db_table
TENANT_TABLE = Tenant._meta.db_table
TOTAL_KEY = ("tenant_id", "bucket_start", "gpu_type", "tier", "region")
TOTAL_COLUMNS = (*TOTAL_KEY, "currency", *ROLLUP_SUMS)


def _upsert(table: str, key: tuple[str, ...]) -> str:
    """The ON CONFLICT clause that adds a new row's sums to an existing one."""
    increments = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in ROLLUP_SUMS)
    return f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {increments}"


METER_PLAN_COLUMNS = (
    "hour", "day", "currency", "tier_1", "tier_2",
    *(f"{name}_{slot}" for slot in (1, 2) for name in ROLLUP_SUMS),
)  # fmt: skip
METER_SUMS = METER_PLAN_COLUMNS[5:]
# A meter's fields once its hour has gone to the rollups.
EMPTY_HELD = {"hour": None, "day": None, "currency": "", "tier_1": "", "tier_2": "",
              **dict.fromkeys(METER_SUMS, ZERO)}  # fmt: skip


def _plan_values(plan: _MeterPlan) -> tuple:
    """A plan as METER_PLAN_COLUMNS' values."""
    held = plan.held
    return (held.hour, plan.day, held.currency, held.tier_1, held.tier_2, *plan.sums)


class _Writer(ABC):
    """What every writer does with a tick; subclasses move the rows."""

    @abstractmethod
    def meters(self, plans: list[_MeterPlan], new: list[tuple], moved: list[tuple]) -> None:
        """Insert the new meters and update the moved ones ((job, metered until, open,
        plan index) each): the cursor, the held hour, and the plan's sums added to the
        slots."""

    @abstractmethod
    def insert_records(self, ledger: _TickLedger, *, created_at: datetime) -> int:
        """Insert the tick's records, skipping any that exist; returns how many were new."""

    def add_to_rollups(self, ledger: _TickLedger) -> None:
        """Add the tick's direct rollup pieces to their job rollup rows."""
        _upsert_rollups(ledger.rollups())

    def ledger(self, ledger: _TickLedger, *, created_at: datetime) -> None:
        if not ledger.charges:
            return
        inserted = self.insert_records(ledger, created_at=created_at)
        if inserted != len(ledger.charges):
            # Only a ledger edited behind the meters' back gets here: which records were
            # new is unknown, so the tenants' rollups are recomputed from the ledger.
            log.error(
                "metering: %s of %s records existed already",
                len(ledger.charges) - inserted,
                len(ledger.charges),
            )
            for tenant_id in sorted(ledger.tenants):
                rollups_rebuild(tenant_id=tenant_id)
            return
        if ledger.rollup_charges:
            self.add_to_rollups(ledger)
        _upsert_totals(ledger.totals())


class _PortableWriter(_Writer):
    """Standard SQL through `executemany` (SQLite and PostgreSQL): one statement per
    kind of row, whatever the number of rows."""

    def __init__(self) -> None:
        self.adapt_datetime = connection.ops.adapt_datetimefield_value

    def meters(self, plans: list[_MeterPlan], new: list[tuple], moved: list[tuple]) -> None:
        dt = self.adapt_datetime
        values = [(dt(hour), dt(day), *rest) for hour, day, *rest in map(_plan_values, plans)]
        with connection.cursor() as cursor:
            if new:
                columns = (*METER_COLUMNS, *METER_PLAN_COLUMNS)
                cursor.executemany(
                    f"INSERT INTO {METER_TABLE} ({', '.join(columns)}) "  # noqa: S608
                    f"VALUES ({', '.join(['%s'] * len(columns))})",
                    [(job_id, dt(until), is_open, *values[plan])
                     for job_id, until, is_open, plan in new],
                )  # fmt: skip
            if moved:
                added = ", ".join(f"{c} = {c} + %s" for c in METER_SUMS)
                cursor.executemany(
                    f"UPDATE {METER_TABLE} SET metered_until = %s, open = %s, "  # noqa: S608
                    f"hour = %s, day = %s, currency = %s, tier_1 = %s, tier_2 = %s, {added} "
                    "WHERE job_id = %s",
                    [(dt(until), is_open, *values[plan], job_id)
                     for job_id, until, is_open, plan in moved],
                )  # fmt: skip

    def insert_records(self, ledger: _TickLedger, *, created_at: datetime) -> int:
        dt = self.adapt_datetime
        columns = ("job_id", *RECORD_COLUMNS, "created_at")
        created = dt(created_at)
        params = [
            (r.job_ref, *r[:8], dt(r.interval_start), dt(r.interval_end), *r[10:20], created)
            for r in ledger.rows()
        ]
        with connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {RECORD_TABLE} ({', '.join(columns)}) "  # noqa: S608
                f"VALUES ({', '.join(['%s'] * len(columns))}) ON CONFLICT DO NOTHING",
                params,
            )
            return cursor.rowcount


def _rollup_rows(rows, *, monthly_before: datetime | None) -> dict[tuple, list]:
    """Job rollup sums of ledger rows: hourly and daily ones, and monthly ones for those
    whose day started before `monthly_before` (days already rolled into months)."""
    sums: dict[tuple, list] = {}

    def add(key: tuple, r) -> None:
        row = sums.get(key)
        if row is None:
            sums[key] = [r.job_name, r.project, r.currency, *(getattr(r, f) for f in ROLLUP_SUMS)]
        else:
            row[3] += r.gpu_seconds
            row[4] += r.cpu_seconds
            row[5] += r.amount
            row[6] += r.on_demand_amount

    for r in rows:
        rest = (r.job_ref, r.gpu_type, r.tier, r.region)
        day = r.hour_start.replace(hour=0)
        add((r.tenant_id, Bucket.HOUR, r.hour_start, *rest), r)
        add((r.tenant_id, Bucket.DAY, day, *rest), r)
        if monthly_before is not None and day < monthly_before:
            add((r.tenant_id, Bucket.MONTH, day.replace(day=1), *rest), r)
    return sums


def _upsert_rollups(rollups: dict[tuple, list]) -> None:
    """Add sums to job rollup rows ({(tenant, bucket, start, job, GPU type, tier, region):
    [name, project, currency, *sums]}), creating the missing ones."""
    if not rollups:
        return
    dt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {ROLLUP_TABLE} ({', '.join(ROLLUP_COLUMNS)}) "  # noqa: S608
            f"VALUES ({', '.join(['%s'] * len(ROLLUP_COLUMNS))}) "
            + _upsert(ROLLUP_TABLE, ROLLUP_KEY),
            [(t, b, dt(start), *rest, *values) for (t, b, start, *rest), values in rollups.items()],
        )


def _total_rows(rows) -> dict[tuple, list]:
    sums: dict[tuple, list] = {}
    for r in rows:
        key = (r.tenant_id, r.hour_start.replace(hour=0), r.gpu_type, r.tier, r.region)
        row = sums.get(key)
        if row is None:
            sums[key] = [r.currency, *(getattr(r, f) for f in ROLLUP_SUMS)]
        else:
            row[1] += r.gpu_seconds
            row[2] += r.cpu_seconds
            row[3] += r.amount
            row[4] += r.on_demand_amount
    return sums


def _upsert_totals(totals: dict[tuple, list]) -> None:
    """Add sums to daily totals ({(tenant, day, GPU type, tier, region): [currency,
    *sums]}), creating the missing ones."""
    if not totals:
        return
    # The ORM's own encoding of datetimes, so SQLite text values compare equal.
    dt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {TOTAL_TABLE} ({', '.join(TOTAL_COLUMNS)}) "  # noqa: S608
            f"VALUES ({', '.join(['%s'] * len(TOTAL_COLUMNS))}) " + _upsert(TOTAL_TABLE, TOTAL_KEY),
            [(t, dt(day), *rest, *values) for (t, day, *rest), values in totals.items()],
        )


def rollups_add(rows, *, monthly_before: datetime | None) -> None:
    """Add ledger rows (anything with LedgerRow's fields) to the hourly and daily job
    rollups, to the monthly ones where their day started before `monthly_before`, and to
    the daily totals: one upsert each that increments existing rows (INSERT … ON
    CONFLICT DO UPDATE, on SQLite and PostgreSQL alike)."""
    _upsert_rollups(_rollup_rows(rows, monthly_before=monthly_before))
    _upsert_totals(_total_rows(rows))


# PostgreSQL types of the columns rows travel in: LedgerRow's fields, a meter's, a charge's.
COLUMN_TYPES = {
    "tenant_id": "bigint",
    "job_ref": "bigint",
    "job_name": "text",
    "project": "text",
    "attempt": "integer",
    "tier": "text",
    "gpu_type_id": "bigint",
    "region_id": "bigint",
    "interval_start": "timestamptz",
    "interval_end": "timestamptz",
    "units": "integer",
    "gpu_seconds": "numeric",
    "cpu_seconds": "numeric",
    "price_version_id": "bigint",
    "unit_price": "numeric",
    "discount_percent": "numeric",
    "amount": "numeric",
    "on_demand_amount": "numeric",
    "currency": "text",
    "note": "text",
    "hour_start": "timestamptz",
    "gpu_type": "text",
    "region": "text",
    "job_id": "bigint",
    "metered_until": "timestamptz",
    "open": "boolean",
    "piece": "integer",
    "plan": "integer",
    "bucket": "text",
    "bucket_start": "timestamptz",
    "hour": "timestamptz",
    "day": "timestamptz",
    "tier_1": "text",
    "tier_2": "text",
    **{f"{name}_{slot}": "numeric" for slot in (1, 2) for name in ROLLUP_SUMS},
}
METER_COLUMNS = ("job_id", "metered_until", "open")
METER_ROW_COLUMNS = (*METER_COLUMNS, "plan")
CHARGE_COLUMNS = ("job_id", "piece")
ROLLUP_PIECE_COLUMNS = ("bucket", "bucket_start", "gpu_type", "tier", "region", "currency",
                        *ROLLUP_SUMS)  # fmt: skip
PIECE_COLUMNS = RECORD_COLUMNS[RECORD_COLUMNS.index("attempt") :]
# Columns JSON has no type for: sent as their exact text (str() of a Decimal or of an
# aware datetime), which PostgreSQL's casts read back exactly.
AS_TEXT = frozenset(
    name for name, kind in COLUMN_TYPES.items() if kind in ("numeric", "timestamptz")
)


def _json_columns(rows: list[tuple], fields: tuple[str, ...]) -> str:
    """The rows' leading `fields` as one JSON array per column. A tick's values repeat
    (the same interval, price and amount for most jobs), so each distinct Decimal or
    datetime is turned into text once; `json` then encodes the whole tick in C. Binding
    the same rows as typed arrays costs psycopg a Python call per element: several times
    slower."""
    columns = []
    for name, values in zip(fields, zip(*rows, strict=True), strict=False):
        if name in AS_TEXT:
            text = {v: None if v is None else str(v) for v in set(values)}
            values = [text[v] for v in values]
        columns.append(values)
    return json.dumps(columns)


def _json_rows_sql(fields: tuple[str, ...], *, numbered: bool = False) -> str:
    """A FROM item reading `_json_columns(rows, fields)` (one parameter) back as typed
    rows: the arrays are read in step (ROWS FROM zips set functions). `numbered` adds
    each row's 0-based position as `n`."""
    elements = ", ".join(f"jsonb_array_elements_text(d.j -> {n})" for n in range(len(fields)))
    typed = ", ".join(f"c.{name}::{COLUMN_TYPES[name]} AS {name}" for name in fields)
    rows_from, names = f"ROWS FROM ({elements})", ", ".join(fields)
    if numbered:
        rows_from, names, typed = (
            f"{rows_from} WITH ORDINALITY",
            f"{names}, n",
            f"{typed}, c.n - 1 AS n",
        )
    # Our own column names and types only; the values are the parameter.
    return f"(SELECT {typed} FROM (SELECT %s::jsonb AS j) AS d, {rows_from} AS c({names}))"  # noqa: S608


def _fetch(queryset) -> list[tuple]:
    """The rows of a `values_list` queryset. On PostgreSQL they are read through psycopg's
    own timestamptz loader (in C): Django's is a Python subclass, and a big tick reads
    some 30,000 datetimes, which it spends a quarter of a second on."""
    if connection.vendor != "postgresql":
        return list(queryset)
    from psycopg.types.datetime import TimestamptzLoader

    sql, params = queryset.query.sql_with_params()
    with _binary_cursor() as cursor:
        # Registering psycopg's Python class picks its C twin; the session's time zone
        # is UTC (Django sets it), so the values are UTC-aware like Django's.
        cursor.cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        cursor.execute(sql, params)
        return cursor.fetchall()


@contextmanager
def _binary_cursor():
    """A cursor that sends parameters bound on the server in binary (psycopg's own
    `Cursor`) rather than Django's default client-side binding, which quotes every array
    element into the SQL text in Python: for a tick's arrays, over twice as fast."""
    import psycopg

    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    # Django's wrappers: query logging (tests count queries) and error translation.
    if connection.queries_logged:
        cursor = connection.make_debug_cursor(raw)
    else:
        cursor = connection.make_cursor(raw)
    try:
        yield cursor
    finally:
        cursor.close()


class _PostgresWriter(_Writer):
    """PostgreSQL: the meters, the charges and the priced pieces each travel as one JSON
    document, so a tick is a few statements whose size doesn't grow with the number of
    parameters. Each record takes its job's own fields from the job row (locked by this
    tick), the rest from its priced piece; meters take their plan the same way."""

    def meters(self, plans: list[_MeterPlan], new: list[tuple], moved: list[tuple]) -> None:
        plan_rows = _json_rows_sql(METER_PLAN_COLUMNS, numbered=True)
        plan_values = [_json_columns([_plan_values(p) for p in plans], METER_PLAN_COLUMNS)]
        with _binary_cursor() as cursor:
            if new:
                columns = (*METER_COLUMNS, *METER_PLAN_COLUMNS)
                cursor.execute(
                    f"INSERT INTO {METER_TABLE} ({', '.join(columns)}) "  # noqa: S608
                    f"SELECT {', '.join(f'v.{c}' for c in METER_COLUMNS)}, "
                    f"{', '.join(f'p.{c}' for c in METER_PLAN_COLUMNS)} "
                    f"FROM {_json_rows_sql(METER_ROW_COLUMNS)} AS v "
                    f"JOIN {plan_rows} AS p ON p.n = v.plan",
                    [_json_columns(new, METER_ROW_COLUMNS), *plan_values],
                )
            if moved:
                held = ", ".join(f"{c} = p.{c}" for c in METER_PLAN_COLUMNS[:5])
                added = ", ".join(f"{c} = m.{c} + p.{c}" for c in METER_SUMS)
                cursor.execute(
                    f"UPDATE {METER_TABLE} AS m "  # noqa: S608
                    f"SET metered_until = v.metered_until, open = v.open, {held}, {added} "
                    f"FROM {_json_rows_sql(METER_ROW_COLUMNS)} AS v "
                    f"JOIN {plan_rows} AS p ON p.n = v.plan WHERE m.job_id = v.job_id",
                    [_json_columns(moved, METER_ROW_COLUMNS), *plan_values],
                )

    def insert_records(self, ledger: _TickLedger, *, created_at: datetime) -> int:
        record_columns = ("job_id", *RECORD_COLUMNS, "created_at")
        from_job = {"tenant_id": "j.tenant_id", "job_ref": "j.id", "job_name": "j.name",
                    "project": "j.project"}  # fmt: skip
        values = ", ".join(from_job.get(c, f"p.{c}") for c in RECORD_COLUMNS)
        sql = f"""
            INSERT INTO {RECORD_TABLE} ({", ".join(record_columns)})
            SELECT j.id, {values}, %s
            FROM {_json_rows_sql(CHARGE_COLUMNS)} AS c
            JOIN {JOB_TABLE} AS j ON j.id = c.job_id
            JOIN {_json_rows_sql(PIECE_COLUMNS, numbered=True)} AS p ON p.n = c.piece
            ON CONFLICT DO NOTHING
        """  # noqa: S608 (table and column names are ours; values are parameters)
        charges = [(job.pk, index) for job, index in ledger.charges]
        with _binary_cursor() as cursor:
            cursor.execute(
                sql,
                [
                    created_at,
                    _json_columns(charges, CHARGE_COLUMNS),
                    _json_columns(ledger.pieces, PIECE_COLUMNS),
                ],
            )
            return cursor.rowcount

    def add_to_rollups(self, ledger: _TickLedger) -> None:
        # A tick's first of a new hour sends every job's last piece here: as many rows as
        # jobs, so they travel like the records.
        from_job = {"tenant_id": "j.tenant_id", "job_ref": "j.id", "job_name": "j.name",
                    "project": "j.project"}  # fmt: skip
        values = ", ".join(from_job.get(c, f"p.{c}") for c in ROLLUP_COLUMNS)
        sql = f"""
            INSERT INTO {ROLLUP_TABLE} ({", ".join(ROLLUP_COLUMNS)})
            SELECT {values}
            FROM {_json_rows_sql(CHARGE_COLUMNS)} AS c
            JOIN {JOB_TABLE} AS j ON j.id = c.job_id
            JOIN {_json_rows_sql(ROLLUP_PIECE_COLUMNS, numbered=True)} AS p ON p.n = c.piece
            {_upsert(ROLLUP_TABLE, ROLLUP_KEY)}
        """  # noqa: S608 (table and column names are ours; values are parameters)
        charges = [(job.pk, index) for job, index in ledger.rollup_charges]
        with _binary_cursor() as cursor:
            cursor.execute(
                sql,
                [
                    _json_columns(charges, CHARGE_COLUMNS),
                    _json_columns(ledger.rollup_pieces, ROLLUP_PIECE_COLUMNS),
                ],
            )


@transaction.atomic
def rollups_rebuild(*, tenant_id: int | None = None) -> int:
    """Recompute every rollup and daily total from the ledger (a repair tool; the tick
    never needs it). What the meters held is then in the rollups, so they hold nothing."""
    rollups, totals = UsageRollup.objects.all(), UsageDailyTotal.objects.all()
    records, meters = UsageRecord.objects.all(), JobMeter.objects.all()
    if tenant_id is not None:
        rollups, totals = rollups.filter(tenant_id=tenant_id), totals.filter(tenant_id=tenant_id)
        records = records.filter(tenant_id=tenant_id)
        meters = meters.filter(job__tenant_id=tenant_id)
    rollups.delete()
    totals.delete()
    meters.exclude(hour=None).update(**EMPTY_HELD)
    monthly_mark = rollup_marks().monthly
    count = 0
    batch: list[_RebuildRow] = []
    for values in records.values_list(*REBUILD_FIELDS).iterator(chunk_size=2000):
        batch.append(_RebuildRow._make(values))
        if len(batch) == 2000:
            rollups_add(batch, monthly_before=monthly_mark)
            count, batch = count + len(batch), []
    rollups_add(batch, monthly_before=monthly_mark)
    return count + len(batch)


REBUILD_FIELDS = ("tenant_id", "job_ref", "job_name", "project", "tier", "interval_start",
                  "currency", "gpu_type__slug", "region__slug", *ROLLUP_SUMS)  # fmt: skip


class _RebuildRow(NamedTuple):
    tenant_id: int
    job_ref: int
    job_name: str
    project: str
    tier: str
    interval_start: datetime
    currency: str
    gpu_slug: str | None
    region: str
    gpu_seconds: Decimal
    cpu_seconds: Decimal
    amount: Decimal
    on_demand_amount: Decimal

    @property
    def gpu_type(self) -> str:
        return self.gpu_slug or "cpu"

    @property
    def hour_start(self) -> datetime:
        return self.interval_start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
