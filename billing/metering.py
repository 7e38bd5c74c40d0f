"""Metering: turn jobs' running time into priced, contiguous, unique usage records.

One tick (`meter_tick`) runs in one transaction with the candidate jobs locked, and ticks
take turns, so two ticks can't write the same interval; the unique key (job, attempt,
tier, interval start) backs that up. The number of queries is constant whatever the
number of jobs.

A job is billed from the moment it is running until its compute is released
(`running` and `pausing`); queueing, provisioning and paused time are not billed.
Intervals are split at hour boundaries and at price-version changes, so each record is
priced by the version in force when it ran and rolls up into one hour. Daily rollups grow
every tick; hourly ones are written when their hour has closed (`HourlyRollupMark`),
monthly ones when their days have closed (`MonthlyRollupMark`).

A tick handles thousands of running jobs, so it works on plain value tuples, never on
model instances, and writes in bulk: on PostgreSQL one statement inserts the records from
one JSON parameter and adds exactly the inserted ones to the rollups; elsewhere (SQLite,
the embedded default) `executemany` does the same work in three statements.
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_right
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import F, Min, Q, Sum
from django.db.models.functions import TruncMonth
from django.utils import timezone

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


class LedgerRow(NamedTuple):
    """One usage record to write; the fields after `note` only feed the rollups."""

    tenant_id: int
    job_ref: int
    job_name: str
    project: str
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
    hour_start: datetime
    gpu_type: str  # slug, or "cpu"
    region: str  # slug


RECORD_COLUMNS = LedgerRow._fields[: LedgerRow._fields.index("note") + 1]


def _tiers(job: _JobRow) -> list[tuple[str, int]]:
    """(tier, units) shares of a job: each node billed at its actual tier."""
    per_node = job.gpus_per_node if job.gpu_type_id else job.cpus
    base_tier = job.pool__tier or Tier.ON_DEMAND
    shares = [(base_tier, job.on_demand_nodes * per_node), (Tier.SPOT, job.spot_nodes * per_node)]
    return [(tier, units) for tier, units in shares if units > 0]


class _TickLedger:
    """A tick's records as (job, priced piece) charges. A priced piece is everything of a
    ledger row but the job's own fields (tenant, id, name, project): it is computed once
    per tick for each (piece, tier, units, GPU type, region, discount), since most running
    jobs bill the same 30 s at the same price. A big tick prices a handful of pieces and
    charges them ten thousand times; the PostgreSQL writer ships just that."""

    def __init__(self, book: _PriceBook) -> None:
        self.book = book
        self.pieces: list[tuple] = []  # LedgerRow's fields from `attempt` on
        self.charges: list[tuple[_JobRow, int]] = []  # (job, index into `pieces`)
        self._index: dict[tuple, int] = {}

    def charge(self, job: _JobRow, spans: list[Span]) -> None:
        discount = self.book.discounts.get(job.tenant_id, ZERO)
        tiers = _tiers(job)
        for span in spans:
            for piece in _split(span, self.book.change_points):
                for tier, units in tiers:
                    key = (piece, tier, units, job.gpu_type_id, job.region_id, discount)
                    index = self._index.get(key)
                    if index is None:
                        index = self._index[key] = len(self.pieces)
                        self.pieces.append(self._tail(job, piece, tier, units, discount))
                    self.charges.append((job, index))

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

    def _tail(self, job: _JobRow, piece: Span, tier: str, units: int, discount: Decimal):
        start = piece.start
        price = self.book.price(job, tier, start)
        # Exact: a timedelta is a whole number of microseconds.
        seconds = Decimal((piece.end - start) // timedelta(microseconds=1)) / MICROSECONDS
        unit_seconds = (seconds * units).quantize(SECONDS_QUANTUM)
        is_gpu = job.gpu_type_id is not None
        return (
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


class RollupMarks(NamedTuple):
    """How far the hourly and the monthly job rollups are complete (`HourlyRollupMark`,
    `MonthlyRollupMark`); None where nothing is rolled up yet."""

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


@transaction.atomic
def meter_tick(*, now: datetime | None = None) -> TickResult:
    now = now or timezone.now()
    if connection.vendor == "postgresql":
        # Ticks take turns, so each reads the meters its predecessor committed. (SQLite's
        # immediate transactions already serialize every writer.)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [TICK_LOCK])
            # The commit needn't wait for its WAL flush: a crash can only lose the whole
            # tick (records and meters together, never half of it), which the next tick
            # then bills again from the same meters.
            cursor.execute("SET LOCAL synchronous_commit = off")
    jobs = _fetch(
        Job.objects.select_for_update(of=("self",)).filter(CANDIDATES).values_list(*JOB_COLUMNS)
    )
    writer = _PostgresWriter() if use_postgres_bulk_sql() else _PortableWriter()
    marks = rollup_marks()
    if not jobs:
        _close_hours(writer, marks.hourly, now)
        roll_closed_days(marks.monthly, now)
        return TickResult(0, 0, set())
    # The locked jobs are still candidates in the next statements' snapshots: only a tick
    # changes meters, and the jobs' own rows are locked.
    candidates = Job.objects.filter(CANDIDATES).values("pk")
    meters = {
        job_id: (until, is_open)
        for job_id, until, is_open in _fetch(
            JobMeter.objects.filter(job__in=candidates).values_list(
                "job_id", "metered_until", "open"
            )
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

    ledger = _TickLedger(_PriceBook())
    new_meters: list[tuple[int, datetime, bool]] = []
    moved_meters: list[tuple[int, datetime, bool]] = []
    for job in map(_JobRow._make, jobs):
        events = changes.get(job.pk, ())
        meter = meters.get(job.pk)
        if meter is None:
            since = next((e.at for e in events if e.to_status in BILLED), job.started_at or now)
        else:
            since = meter[0]
        still_billed = job.status in BILLED
        # A job that ended after this tick's clock was read (while we waited for its row
        # lock) is billed to its real end, not cut at `now`.
        until = now if still_billed or not events else max(now, events[-1].at)
        spans = billed_spans(events, since, until)
        ledger.charge(job, spans)
        # A job that isn't billed now has nothing left to bill before `until`.
        metered_until = now if still_billed else max(since, until)
        if meter is None:
            new_meters.append((job.pk, metered_until, still_billed))
        elif meter != (metered_until, still_billed):
            moved_meters.append((job.pk, metered_until, still_billed))

    writer.meters(new_meters, moved_meters)
    # The locked rows and the cursor make a duplicate impossible; the unique key is the
    # last line of defence, and only rows really inserted reach the rollups.
    writer.ledger(ledger, created_at=timezone.now(), marks=marks)
    _close_hours(writer, marks.hourly, now)
    roll_closed_days(marks.monthly, now)
    return TickResult(len(jobs), len(ledger.charges), ledger.tenants)


def _close_hours(writer, hourly_mark: datetime | None, now: datetime) -> None:
    """Sum the hours that closed since the last mark into hourly rollups (once an hour,
    after this tick's records are in the ledger) and move the mark."""
    current_hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if hourly_mark is not None and hourly_mark >= current_hour:
        return
    writer.roll_hours(since=hourly_mark, until=current_hour)
    if not HourlyRollupMark.objects.update(rolled_until=current_hour):
        HourlyRollupMark.objects.create(rolled_until=current_hour)


def roll_closed_days(monthly_mark: datetime | None, now: datetime) -> None:
    """Add the days that closed since the last mark (their daily job rollups) to the
    monthly rollups and move the mark: once a day, a few rows per job."""
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if monthly_mark is not None and monthly_mark >= today:
        return
    days = UsageRollup.objects.filter(bucket=Bucket.DAY, bucket_start__lt=today)
    if monthly_mark is not None:
        days = days.filter(bucket_start__gte=monthly_mark)
    keys = ("tenant_id", "month", "job_ref", "gpu_type", "tier", "region")
    sums = {f"sum_{name}": Sum(name) for name in ROLLUP_SUMS}
    months = {
        (cell["tenant_id"], Bucket.MONTH, cell["month"], *(cell[k] for k in keys[2:])): [
            cell["first_name"],
            cell["first_project"],
            cell["first_currency"],
            *(cell[name] for name in sums),
        ]
        for cell in days.annotate(month=TruncMonth("bucket_start", tzinfo=UTC))
        .values(*keys)
        .annotate(
            first_name=Min("job_name"),
            first_project=Min("project"),
            first_currency=Min("currency"),
            **sums,
        )
        .order_by()
    }
    _upsert_rollups(months)
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


class _PortableWriter:
    """Standard SQL through `executemany` (SQLite and PostgreSQL): one statement per
    kind of row, whatever the number of rows."""

    def __init__(self) -> None:
        self.adapt_datetime = connection.ops.adapt_datetimefield_value

    def meters(self, new: list[tuple], moved: list[tuple]) -> None:
        dt = self.adapt_datetime
        with connection.cursor() as cursor:
            if new:
                cursor.executemany(
                    f"INSERT INTO {METER_TABLE} (job_id, metered_until, open) "  # noqa: S608
                    "VALUES (%s, %s, %s)",
                    [(job_id, dt(until), is_open) for job_id, until, is_open in new],
                )
            if moved:
                cursor.executemany(
                    f"UPDATE {METER_TABLE} SET metered_until = %s, open = %s "  # noqa: S608
                    "WHERE job_id = %s",
                    [(dt(until), is_open, job_id) for job_id, until, is_open in moved],
                )

    def ledger(self, ledger: _TickLedger, *, created_at: datetime, marks: RollupMarks) -> None:
        rows = ledger.rows()
        if not rows:
            return
        dt = self.adapt_datetime
        columns = ("job_id", *RECORD_COLUMNS, "created_at")
        created = dt(created_at)
        params = [
            (r.job_ref, *r[:8], dt(r.interval_start), dt(r.interval_end), *r[10:20], created)
            for r in rows
        ]
        with connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {RECORD_TABLE} ({', '.join(columns)}) "  # noqa: S608
                f"VALUES ({', '.join(['%s'] * len(columns))}) ON CONFLICT DO NOTHING",
                params,
            )
            inserted = cursor.rowcount
        if inserted == len(rows):
            rollups_add(rows, hourly_before=marks.hourly, monthly_before=marks.monthly)
        else:
            # Only a ledger edited behind the meters' back gets here: which rows were new
            # is unknown, so the affected tenants' rollups are recomputed from the ledger.
            log.error("metering: %s of %s records existed already", len(rows) - inserted, len(rows))
            for tenant_id in sorted({r.tenant_id for r in rows}):
                rollups_rebuild(tenant_id=tenant_id)

    def roll_hours(self, *, since: datetime | None, until: datetime) -> None:
        records = UsageRecord.objects.filter(interval_start__lt=until)
        if since is not None:
            records = records.filter(interval_start__gte=since)
        batch: list[_RebuildRow] = []
        for values in records.values_list(*REBUILD_FIELDS).iterator(chunk_size=2000):
            batch.append(_RebuildRow._make(values))
        rollups_add(batch, hourly_before=until, daily=False)


def _rollup_rows(
    rows, *, hourly_before: datetime | None, monthly_before: datetime | None, daily: bool
) -> dict[tuple, list]:
    """Job rollup sums: daily ones (if `daily`), monthly ones for those whose day started
    before `monthly_before` (days already rolled into months), and hourly ones for the
    rows whose hour started before `hourly_before` (hours already rolled, or being rolled
    now)."""
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
        if daily:
            day = r.hour_start.replace(hour=0)
            add((r.tenant_id, Bucket.DAY, day, *rest), r)
            if monthly_before is not None and day < monthly_before:
                add((r.tenant_id, Bucket.MONTH, day.replace(day=1), *rest), r)
        if hourly_before is not None and r.hour_start < hourly_before:
            add((r.tenant_id, Bucket.HOUR, r.hour_start, *rest), r)
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


def rollups_add(
    rows,
    *,
    hourly_before: datetime | None,
    monthly_before: datetime | None = None,
    daily: bool = True,
) -> None:
    """Add ledger rows (anything with LedgerRow's fields) to the daily job rollups and
    to the daily totals (if `daily`), to the monthly job rollups where their day started
    before `monthly_before`, and to the hourly job rollups where their hour started
    before `hourly_before`: one upsert each that increments existing rows
    (INSERT … ON CONFLICT DO UPDATE, on SQLite and PostgreSQL alike)."""
    rollups = _rollup_rows(
        rows, hourly_before=hourly_before, monthly_before=monthly_before, daily=daily
    )
    if not rollups:
        return
    totals = _total_rows(rows) if daily else {}
    _upsert_rollups(rollups)
    # The ORM's own encoding of datetimes, so SQLite text values compare equal.
    dt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        if totals:
            cursor.executemany(
                f"INSERT INTO {TOTAL_TABLE} ({', '.join(TOTAL_COLUMNS)}) "  # noqa: S608
                f"VALUES ({', '.join(['%s'] * len(TOTAL_COLUMNS))}) "
                + _upsert(TOTAL_TABLE, TOTAL_KEY),
                [(t, dt(day), *rest, *values) for (t, day, *rest), values in totals.items()],
            )


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
}
METER_COLUMNS = ("job_id", "metered_until", "open")
CHARGE_COLUMNS = ("job_id", "piece")
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


class _PostgresWriter:
    """PostgreSQL: the meters, the charges and the priced pieces each travel as one JSON
    document, so a tick is a couple of statements whose size doesn't grow with the
    number of parameters, and the rollups are fed from `RETURNING`: exactly the
    records this tick inserted."""

    def meters(self, new: list[tuple], moved: list[tuple]) -> None:
        with _binary_cursor() as cursor:
            if new:
                cursor.execute(
                    f"INSERT INTO {METER_TABLE} ({', '.join(METER_COLUMNS)}) "  # noqa: S608
                    f"SELECT * FROM {_json_rows_sql(METER_COLUMNS)} AS v",
                    [_json_columns(new, METER_COLUMNS)],
                )
            if moved:
                cursor.execute(
                    f"UPDATE {METER_TABLE} AS m "  # noqa: S608
                    "SET metered_until = v.metered_until, open = v.open "
                    f"FROM {_json_rows_sql(METER_COLUMNS)} AS v WHERE m.job_id = v.job_id",
                    [_json_columns(moved, METER_COLUMNS)],
                )

    def ledger(self, ledger: _TickLedger, *, created_at: datetime, marks: RollupMarks) -> None:
        if not ledger.charges:
            return
        record_columns = ("job_id", *RECORD_COLUMNS, "created_at")
        # Each record: its job's own fields from the job row (locked by this tick), the
        # rest from its priced piece.
        from_job = {"tenant_id": "j.tenant_id", "job_ref": "j.id", "job_name": "j.name",
                    "project": "j.project"}  # fmt: skip
        values = ", ".join(from_job.get(c, f"p.{c}") for c in RECORD_COLUMNS)
        labels = ("tenant_id", "job_ref", "job_name", "project", "tier", "currency")
        sums = ", ".join(f"sum(a.{c})" for c in ROLLUP_SUMS)
        # Data-modifying CTEs all run to completion, read or not (PostgreSQL docs, WITH).
        # The rollups read what the INSERT returns: exactly the records it added.
        sql = f"""
            WITH inserted AS (
                INSERT INTO {RECORD_TABLE} ({", ".join(record_columns)})
                SELECT j.id, {values}, %s
                FROM {_json_rows_sql(CHARGE_COLUMNS)} AS c
                JOIN {JOB_TABLE} AS j ON j.id = c.job_id
                JOIN {_json_rows_sql(PIECE_COLUMNS, numbered=True)} AS p ON p.n = c.piece
                ON CONFLICT DO NOTHING
                RETURNING {", ".join(labels)}, gpu_type_id, region_id, interval_start,
                          {", ".join(ROLLUP_SUMS)}
            ),
            added AS MATERIALIZED (
                SELECT {", ".join(f"i.{c}" for c in (*labels, *ROLLUP_SUMS))},
                       date_trunc('day', i.interval_start AT TIME ZONE 'UTC')
                           AT TIME ZONE 'UTC' AS day,
                       date_trunc('hour', i.interval_start AT TIME ZONE 'UTC')
                           AT TIME ZONE 'UTC' AS hour,
                       coalesce(g.slug, 'cpu') AS gpu_type, r.slug AS region
                FROM inserted AS i
                LEFT JOIN {GPU_TYPE_TABLE} AS g ON g.id = i.gpu_type_id
                JOIN {REGION_TABLE} AS r ON r.id = i.region_id
            ),
            rolled_up AS (
                INSERT INTO {ROLLUP_TABLE} ({", ".join(ROLLUP_COLUMNS)})
                SELECT a.tenant_id, '{Bucket.DAY}', a.day, a.job_ref, a.gpu_type, a.tier, a.region,
                       min(a.job_name), min(a.project), min(a.currency), {sums}
                FROM added AS a
                GROUP BY a.tenant_id, a.day, a.job_ref, a.gpu_type, a.tier, a.region
                {_upsert(ROLLUP_TABLE, ROLLUP_KEY)}
            ),
            late_hours AS (
                -- Records of hours already rolled (late arrivals) go straight to them.
                INSERT INTO {ROLLUP_TABLE} ({", ".join(ROLLUP_COLUMNS)})
                SELECT a.tenant_id, '{Bucket.HOUR}', a.hour, a.job_ref, a.gpu_type, a.tier,
                       a.region, min(a.job_name), min(a.project), min(a.currency), {sums}
                FROM added AS a
                WHERE a.hour < %s::timestamptz
                GROUP BY a.tenant_id, a.hour, a.job_ref, a.gpu_type, a.tier, a.region
                {_upsert(ROLLUP_TABLE, ROLLUP_KEY)}
            ),
            late_days AS (
                -- Records of days already rolled into months go straight to them too.
                INSERT INTO {ROLLUP_TABLE} ({", ".join(ROLLUP_COLUMNS)})
                SELECT a.tenant_id, '{Bucket.MONTH}',
                       date_trunc('month', a.day AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
                       a.job_ref, a.gpu_type, a.tier, a.region,
                       min(a.job_name), min(a.project), min(a.currency), {sums}
                FROM added AS a
                WHERE a.day < %s::timestamptz
                GROUP BY a.tenant_id, 3, a.job_ref, a.gpu_type, a.tier, a.region
                {_upsert(ROLLUP_TABLE, ROLLUP_KEY)}
            )
            INSERT INTO {TOTAL_TABLE} ({", ".join(TOTAL_COLUMNS)})
            SELECT a.tenant_id, a.day, a.gpu_type, a.tier, a.region, min(a.currency), {sums}
            FROM added AS a
            GROUP BY 1, 2, 3, 4, 5
            {_upsert(TOTAL_TABLE, TOTAL_KEY)}
        """  # noqa: S608 (table and column names are ours; values are parameters)
        with _binary_cursor() as cursor:
            # Room to sort a big tick's rollups in memory rather than in temporary files.
            cursor.execute("SET LOCAL work_mem = '64MB'")
            charges = [(job.pk, index) for job, index in ledger.charges]
            cursor.execute(
                sql,
                [
                    created_at,
                    _json_columns(charges, CHARGE_COLUMNS),
                    _json_columns(ledger.pieces, PIECE_COLUMNS),
                    marks.hourly,
                    marks.monthly,
                ],
            )

    def roll_hours(self, *, since: datetime | None, until: datetime) -> None:
        """One statement: the closed hours' records summed into hourly job rollups. The
        tenant list lets the (tenant, interval_start) index find the hours' records."""
        sums = ", ".join(f"sum(u.{c})" for c in ROLLUP_SUMS)
        since_clause = "AND u.interval_start >= %s" if since is not None else ""
        sql = f"""
            INSERT INTO {ROLLUP_TABLE} ({", ".join(ROLLUP_COLUMNS)})
            SELECT u.tenant_id, '{Bucket.HOUR}',
                   date_trunc('hour', u.interval_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
                   u.job_ref, coalesce(g.slug, 'cpu'), u.tier, r.slug,
                   min(u.job_name), min(u.project), min(u.currency), {sums}
            FROM {RECORD_TABLE} AS u
            LEFT JOIN {GPU_TYPE_TABLE} AS g ON g.id = u.gpu_type_id
            JOIN {REGION_TABLE} AS r ON r.id = u.region_id
            WHERE u.tenant_id = ANY(ARRAY(SELECT id FROM {TENANT_TABLE}))
              AND u.interval_start < %s {since_clause}
            GROUP BY 1, 3, 4, 5, 6, 7
            {_upsert(ROLLUP_TABLE, ROLLUP_KEY)}
        """  # noqa: S608 (table and column names are ours; values are parameters)
        with connection.cursor() as cursor:
            cursor.execute(sql, [until] if since is None else [until, since])


@transaction.atomic
def rollups_rebuild(*, tenant_id: int | None = None) -> int:
    """Recompute every rollup and daily total from the ledger (a repair tool; the tick
    never needs it)."""
    rollups, totals = UsageRollup.objects.all(), UsageDailyTotal.objects.all()
    records = UsageRecord.objects.all()
    if tenant_id is not None:
        rollups, totals = rollups.filter(tenant_id=tenant_id), totals.filter(tenant_id=tenant_id)
        records = records.filter(tenant_id=tenant_id)
    rollups.delete()
    totals.delete()
    marks = rollup_marks()
    count = 0
    batch: list[_RebuildRow] = []
    for values in records.values_list(*REBUILD_FIELDS).iterator(chunk_size=2000):
        batch.append(_RebuildRow._make(values))
        if len(batch) == 2000:
            rollups_add(batch, hourly_before=marks.hourly, monthly_before=marks.monthly)
            count, batch = count + len(batch), []
    rollups_add(batch, hourly_before=marks.hourly, monthly_before=marks.monthly)
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
