"""The job rollups and daily totals that metering keeps alongside the ledger.

Statements only (the transactions that take turns around them are in `tick`): moving
meters' pending hours into the hourly and daily job rollups, rolling closed days into the
monthly ones, the marks of how far both went, adding ledger rows to rollups and totals,
and `rollups_rebuild`, the repair tool that recomputes them all from the ledger.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import Min

from billing.dbviews import METER_ROLLUP
from billing.metering.tables import (
    EMPTY_PENDING_HOUR,
    ROLLUP_COLUMNS,
    ROLLUP_KEY,
    ROLLUP_LABELS,
    ROLLUP_SUMS,
    ROLLUP_TABLE,
    TOTAL_COLUMNS,
    TOTAL_KEY,
    TOTAL_TABLE,
    upsert_clause,
)
from billing.models import (
    Bucket,
    HourlyRollupMark,
    JobMeter,
    MonthlyRollupMark,
    UsageDailyTotal,
    UsageRecord,
    UsageRollup,
)


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


def move_pending_to_rollups(where: str, params: list) -> None:
    """Add what the meters matching `where` (on the meter rollup view) hold to the job
    rollups; the caller empties those meters."""
    # Each meter is one job and its two slots hold two tiers, so the rows have distinct
    # keys. SQLite needs the WHERE to read ON CONFLICT as the upsert's.
    sql = (
        f"INSERT INTO {ROLLUP_TABLE} ({', '.join(ROLLUP_COLUMNS)}) "  # noqa: S608
        f"SELECT {', '.join(ROLLUP_COLUMNS)} FROM {METER_ROLLUP} WHERE {where} "
        + upsert_clause(ROLLUP_TABLE, ROLLUP_KEY)
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
        "GROUP BY tenant_id, job_ref, gpu_type, tier, region "
        + upsert_clause(ROLLUP_TABLE, ROLLUP_KEY)
    )
    with connection.cursor() as cursor:
        while start is not None and start < today:
            month = start.astimezone(UTC).replace(day=1)
            until = min((month + timedelta(days=32)).replace(day=1), today)
            cursor.execute(sql, [dt(month), dt(start), dt(until)])
            start = until
    if not MonthlyRollupMark.objects.update(rolled_until=today):
        MonthlyRollupMark.objects.create(rolled_until=today)


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


def upsert_rollups(rollups: dict[tuple, list]) -> None:
    """Add sums to job rollup rows ({(tenant, bucket, start, job, GPU type, tier, region):
    [name, project, currency, *sums]}), creating the missing ones."""
    if not rollups:
        return
    dt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {ROLLUP_TABLE} ({', '.join(ROLLUP_COLUMNS)}) "  # noqa: S608
            f"VALUES ({', '.join(['%s'] * len(ROLLUP_COLUMNS))}) "
            + upsert_clause(ROLLUP_TABLE, ROLLUP_KEY),
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


def upsert_totals(totals: dict[tuple, list]) -> None:
    """Add sums to daily totals ({(tenant, day, GPU type, tier, region): [currency,
    *sums]}), creating the missing ones."""
    if not totals:
        return
    # The ORM's own encoding of datetimes, so SQLite text values compare equal.
    dt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {TOTAL_TABLE} ({', '.join(TOTAL_COLUMNS)}) "  # noqa: S608
            f"VALUES ({', '.join(['%s'] * len(TOTAL_COLUMNS))}) "
            + upsert_clause(TOTAL_TABLE, TOTAL_KEY),
            [(t, dt(day), *rest, *values) for (t, day, *rest), values in totals.items()],
        )


def rollups_add(rows, *, monthly_before: datetime | None) -> None:
    """Add ledger rows (anything with LedgerRow's fields) to the hourly and daily job
    rollups, to the monthly ones where their day started before `monthly_before`, and to
    the daily totals: one upsert each that increments existing rows (INSERT … ON
    CONFLICT DO UPDATE, on SQLite and PostgreSQL alike)."""
    upsert_rollups(_rollup_rows(rows, monthly_before=monthly_before))
    upsert_totals(_total_rows(rows))


class RecordRow(NamedTuple):
    """A record written outside the jobs' tick, as the rollups read it."""

    tenant_id: int
    job_ref: int
    job_name: str
    project: str
    tier: str
    currency: str
    gpu_type: str
    region: str
    hour_start: datetime
    gpu_seconds: Decimal
    cpu_seconds: Decimal
    amount: Decimal
    on_demand_amount: Decimal


def rollups_add_records(records: list[UsageRecord], *, gpu_type: str) -> None:
    """Add records metered outside the jobs' tick (volumes' storage, services' replicas:
    each piece within one hour, none pending) to the rollups and daily totals, under
    `gpu_type` (what the Cost Explorer groups them by: "storage", "cpu")."""
    rollups_add(
        [
            RecordRow(
                tenant_id=r.tenant_id,
                job_ref=r.job_ref,
                job_name=r.job_name,
                project=r.project,
                tier=r.tier,
                currency=r.currency,
                gpu_type=gpu_type,
                region=r.region.slug,
                hour_start=r.interval_start.astimezone(UTC).replace(
                    minute=0, second=0, microsecond=0
                ),
                gpu_seconds=r.gpu_seconds,
                cpu_seconds=r.cpu_seconds,
                amount=r.amount,
                on_demand_amount=r.on_demand_amount,
            )
            for r in records
        ],
        monthly_before=rollup_marks().monthly,
    )


@transaction.atomic
def rollups_rebuild(*, tenant_id: int | None = None) -> int:
    """Recompute every rollup and daily total from the ledger (a repair tool; the tick
    never needs it). What the meters had pending is then in the rollups, so none is pending."""
    rollups, totals = UsageRollup.objects.all(), UsageDailyTotal.objects.all()
    records, meters = UsageRecord.objects.all(), JobMeter.objects.all()
    if tenant_id is not None:
        rollups, totals = rollups.filter(tenant_id=tenant_id), totals.filter(tenant_id=tenant_id)
        records = records.filter(tenant_id=tenant_id)
        meters = meters.filter(job__tenant_id=tenant_id)
    rollups.delete()
    totals.delete()
    meters.exclude(hour=None).update(**EMPTY_PENDING_HOUR)
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
        # Storage records have no GPU type and are no CPU time (billing.metering.storage).
        return self.gpu_slug or ("storage" if self.tier == "storage" else "cpu")

    @property
    def hour_start(self) -> datetime:
        return self.interval_start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
