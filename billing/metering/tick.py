"""The metering tick, and the turns that ticks and rollup moves take.

One tick (`meter_tick`) meters every candidate job up to `now` in one transaction with
the jobs locked, in a constant number of queries. Ticks and rollup moves take turns (a
PostgreSQL advisory lock; SQLite serializes writers anyway), so each reads the meters its
predecessor committed and no interval is written twice; the unique key backs that up.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from billing.metering.ledger import NO_PENDING_HOUR, PendingHour, TickLedger
from billing.metering.postgres import fetch_rows
from billing.metering.prices import PriceBook
from billing.metering.rollups import move_pending_to_rollups, roll_closed_days, rollup_marks
from billing.metering.service_replicas import replicas_meter
from billing.metering.spans import JOB_COLUMNS, JobRow, StatusChange, billed_spans
from billing.metering.storage import storage_meter
from billing.metering.tables import EMPTY_PENDING_HOUR
from billing.metering.writers import tick_writer
from billing.models import HourlyRollupMark, JobMeter, MonthlyRollupMark
from jobs.models import BILLED_STATUSES, Job, JobEvent

# Billed now, still being metered, ran and ended before its first tick, or changed
# status since it was last metered (it may have run again between two ticks).
CANDIDATES = (
    Q(status__in=BILLED_STATUSES)
    | Q(meter__open=True)
    | Q(meter__isnull=True, started_at__isnull=False)
    | Q(status_changed_at__gt=F("meter__metered_until"))
)
# Any constant: the key of the PostgreSQL advisory lock that makes ticks take turns.
TICK_LOCK = 0x6767_6D65_7465_72  # "ggmeter"
METER_READ = ("job_id", "metered_until", "open", "hour", "currency", "tier_1", "tier_2")


@dataclass
class TickResult:
    jobs: int
    records: int
    tenants: set[int]

    def merged(self, other: TickResult) -> TickResult:
        return TickResult(
            max(self.jobs, other.jobs), self.records + other.records, self.tenants | other.tenants
        )


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
        _release_pending_hours(hour)
    result = result.merged(_tick(now=now))
    with _ticks_take_turns():  # volumes' storage and services' replicas, in their own turn
        stored, storage_tenants = storage_meter(now=now)
        served, service_tenants = replicas_meter(now=now)
    return result.merged(TickResult(0, stored + served, storage_tenants | service_tenants))


def storage_meter_volume(*, volume_id: int) -> None:
    """Meter one volume up to now, in turn with the ticks (before a resize changes the
    size its unmetered time is billed at)."""
    with _ticks_take_turns():
        storage_meter(now=timezone.now(), volume_ids=[volume_id])


def replicas_meter_before_removal(*, replica_ids: list[int]) -> None:
    """Meter these replicas up to their stop, in turn with the ticks, before their rows
    are deleted (inside the caller's transaction: both commit, or neither)."""
    with _ticks_take_turns():
        replicas_meter(now=timezone.now(), replica_ids=replica_ids)


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
                # No need to wait for the WAL flush: a crash loses the whole transaction,
                # which the next tick redoes from the same meters and marks.
                cursor.execute("SET LOCAL synchronous_commit = off")
        yield


def _tick(*, now: datetime) -> TickResult:
    with _ticks_take_turns():
        return _meter(now=now)


def _meter(*, now: datetime) -> TickResult:
    # SKIP LOCKED: the tick never waits for a job row, so it can't close a lock cycle
    # with a status change or an admission (docs/architecture.md, "Lock order"). A job
    # skipped now stays a candidate and is metered, from its meter's cursor, next tick.
    jobs = fetch_rows(
        Job.objects.select_for_update(of=("self",), skip_locked=True)
        .filter(CANDIDATES)
        .values_list(*JOB_COLUMNS)
    )
    if not jobs:
        return TickResult(0, 0, set())
    # The locked jobs are still candidates in the next statements' snapshots: only a tick
    # changes meters, and the jobs' own rows are locked.
    candidates = Job.objects.filter(CANDIDATES).values("pk")
    meters = {
        job_id: (until, is_open, PendingHour(*pending))
        for job_id, until, is_open, *pending in fetch_rows(
            JobMeter.objects.filter(job__in=candidates).values_list(*METER_READ)
        )
    }
    changes: dict[int, list[StatusChange]] = defaultdict(list)
    for job_id, *change in fetch_rows(
        JobEvent.objects.filter(job__in=candidates)
        # Only changes into or out of billed time can open or close a span.
        .filter(Q(to_status__in=BILLED_STATUSES) | Q(from_status__in=BILLED_STATUSES))
        .exclude(from_status=F("to_status"))
        .order_by("job_id", "at", "pk")
        .values_list("job_id", "at", "to_status", "attempt")
    ):
        changes[job_id].append(StatusChange(*change))

    monthly_mark = MonthlyRollupMark.objects.values_list("rolled_until", flat=True).first()
    ledger = TickLedger(PriceBook(), hour=_hour_before(now), monthly_mark=monthly_mark)
    new_meters: list[tuple[int, datetime, bool, int]] = []
    moved_meters: list[tuple[int, datetime, bool, int]] = []
    for job in map(JobRow._make, jobs):
        events = changes.get(job.pk, ())
        meter = meters.get(job.pk)
        if meter is None:
            since = next(
                (e.at for e in events if e.to_status in BILLED_STATUSES), job.started_at or now
            )
            pending = NO_PENDING_HOUR
        else:
            since, _, pending = meter
        still_billed = job.status in BILLED_STATUSES
        # A job that ended after this tick's clock was read (while we waited for its row
        # lock) is billed to its real end, not cut at `now`.
        until = now if still_billed or not events else max(now, events[-1].at)
        plan = ledger.charge(job, billed_spans(events, since, until), pending)
        # A job that isn't billed now has nothing left to bill before `until`. A cursor
        # never moves back (a late tick of a concurrent round bills nothing).
        metered_until = max(since, now if still_billed else until)
        if meter is None:
            new_meters.append((job.pk, metered_until, still_billed, plan))
        elif meter[:2] != (metered_until, still_billed) or ledger.plans[plan].changes(pending):
            moved_meters.append((job.pk, metered_until, still_billed, plan))

    writer = tick_writer()
    writer.meters(ledger.plans, new_meters, moved_meters)
    # The locked rows and the cursor make a duplicate impossible; the unique key is the
    # last line of defence, and only a tick whose records were all new adds to rollups.
    writer.ledger(ledger, created_at=timezone.now())
    return TickResult(len(jobs), len(ledger.charges), ledger.tenants)


def _release_pending_hours(hour: datetime) -> None:
    """Move every meter's hour before `hour` into the hourly and daily job rollups, and
    the days closed since into the monthly ones; move the marks."""
    with _ticks_take_turns():
        marks = rollup_marks()
        if marks.hourly is not None and marks.hourly >= hour:
            return  # a concurrent round has done it
        dt = connection.ops.adapt_datetimefield_value
        move_pending_to_rollups("pending_hour < %s", [dt(hour)])
        JobMeter.objects.filter(hour__lt=hour).update(**EMPTY_PENDING_HOUR)
        if not HourlyRollupMark.objects.update(rolled_until=hour):
            HourlyRollupMark.objects.create(rolled_until=hour)
        roll_closed_days(marks.monthly, hour)


@transaction.atomic
def release_pending_usage(job_ids: list[int]) -> None:
    """Move what these jobs' meters hold into their rollups now (before the jobs and
    their meters are deleted: the job rollups outlive the job)."""
    if not job_ids:
        return
    _wait_for_turn()  # an hour's rollup move would otherwise move them too
    move_pending_to_rollups(f"job_ref IN ({', '.join(['%s'] * len(job_ids))})", job_ids)
    JobMeter.objects.filter(job_id__in=job_ids).update(**EMPTY_PENDING_HOUR)
