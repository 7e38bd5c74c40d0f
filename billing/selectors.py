"""Reads for the Cost Explorer, job costs and the billing month. They read rollups, never
raw usage records (except a job's own cost)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import (
    Case,
    Count,
    DecimalField,
    F,
    Max,
    Min,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import TruncDate
from django.utils import timezone

from billing.job_costs import PRICED_BY, jobs_run_rates, total_run_rate
from billing.models import (
    Bucket,
    LiveUsageRollup,
    MonthlyRollupMark,
    UsageDailyTotal,
    UsageRecord,
)
from console.service_errors import ServiceError
from jobs.models import BILLED_STATUSES, Job
from jobs.state import job_run_seconds
from marketplace.models import GpuType

GROUP_BY = {
    "gpu_type": "gpu_type",
    "job": "job_name",
    "tier": "tier",
    "region": "region",
    "day": "bucket_start",
    "project": "project",
}
PRESETS = ("this_month", "last_month", "last_7_days", "last_30_days", "last_90_days", "custom")
MAX_RANGE = timedelta(days=731)
# The last day a range may hold: the Explorer reads whole months around a range (up to
# the 1st after its end), which must stay within the calendar `datetime` has (to 9999).
LAST_DAY = date(9998, 12, 31)
HOUR = Decimal(3600)
# Stacked series drawn at most in the daily chart: grouped by job over 90 days there can
# be hundreds, which no legend or eye can follow. The rest is one "Other (n)".
MAX_STACKED_SERIES = 12


@dataclass(frozen=True)
class CostQuery:
    """What the Cost Explorer shows: a date range [start, end) and filters."""

    start: datetime
    end: datetime
    group_by: str = "gpu_type"
    gpu_type: str = ""
    region: str = ""
    tier: str = ""
    job_contains: str = ""
    project: str = ""


def utc_midnight(day: date) -> datetime:
    """The start of `day` in UTC: where usage periods and invoice periods begin."""
    return datetime.combine(day, time.min, tzinfo=UTC)


def period_start(now: datetime) -> datetime:
    """The start of `now`'s calendar month in UTC: the period budgets and the month's
    spend count from."""
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def period_end(now: datetime) -> datetime:
    start = period_start(now)
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


def run_rate(jobs: QuerySet[Job]) -> Decimal:
    """Hourly cost of the given jobs that are running now."""
    return total_run_rate(jobs.filter(status__in=BILLED_STATUSES))


# What a running job's rate and its time left to max runtime are read from.
RUNTIME_FIELDS = ("on_demand_nodes", "status", "status_changed_at", "max_runtime_minutes",
                  "run_seconds", "running_since")  # fmt: skip


def forecast_month_end(*, jobs: QuerySet[Job], spend: Decimal, now: datetime) -> Decimal:
    """Month-end spend: `spend` so far plus what each of `jobs` that runs now costs until
    it reaches its maximum runtime or the month ends, whichever is first. The one forecast
    rule (budgets, Cost Explorer, cost summary API). Not run rate × the rest of the month:
    that made one launch of a 24-hour job forecast a whole month of it, and alerts fired
    from a single launch."""
    month_left = Decimal(str(max(0.0, (period_end(now) - now).total_seconds())))
    running = list(jobs.filter(status__in=BILLED_STATUSES).only(*PRICED_BY, *RUNTIME_FIELDS))
    rates = jobs_run_rates(running)
    forecast = Decimal(spend)
    for job in running:
        runtime_left = max(0.0, job.max_runtime_minutes * 60 - job_run_seconds(job, now))
        seconds = min(Decimal(str(runtime_left)), month_left)
        forecast += (rates[job.pk] or Decimal(0)) * seconds / HOUR
    return forecast


def date_range(
    preset: str, *, start: date | None = None, end: date | None = None, today: date | None = None
) -> tuple[datetime, datetime]:
    """[start, end) in UTC for a preset; `end` of a custom range is inclusive. The one
    parser of a date range: the Cost Explorer, its CSV export and the usage API."""
    today = today or timezone.now().astimezone(UTC).date()
    at = utc_midnight

    if preset == "this_month":
        return at(today.replace(day=1)), at(today + timedelta(days=1))
    if preset == "last_month":
        first_this = today.replace(day=1)
        return at((first_this - timedelta(days=1)).replace(day=1)), at(first_this)
    if preset in ("last_7_days", "last_30_days", "last_90_days"):
        days = int(preset.split("_")[1])
        return at(today - timedelta(days=days - 1)), at(today + timedelta(days=1))
    if preset == "custom":
        if start is None or end is None:
            raise ServiceError("Give a start and an end date.", field="start")
        for name, day in (("start", start), ("end", end)):
            if day > LAST_DAY:
                raise ServiceError(f"Dates go up to {LAST_DAY.isoformat()}.", field=name)
        if end < start:
            raise ServiceError("The end date is before the start date.", field="end")
        if at(end) - at(start) > MAX_RANGE:
            raise ServiceError("A range is at most two years.", field="end")
        return at(start), at(end + timedelta(days=1))
    raise ServiceError(f"Unknown range “{preset}”.", field="range")


def covering(
    start: datetime, end: datetime, monthly_mark: datetime | None
) -> list[tuple[str, datetime, datetime, int]]:
    """Which job rollup rows sum to exactly the day-aligned range [start, end), as
    (bucket, from, until, sign) pieces: a month's row (which holds its days up to the
    mark) where the range holds all of those days from the 1st, or most of them (the
    days before the range are then subtracted: fewer rows than adding the rest), daily
    rows for the rest."""
    pieces: list[tuple[str, datetime, datetime, int]] = []
    uncovered_from = start
    month = start.replace(day=1)
    while month < end:
        next_month = (month + timedelta(days=32)).replace(day=1)
        rolled_until = min(monthly_mark, next_month) if monthly_mark is not None else month
        if month < rolled_until <= end:
            if start <= month:
                if uncovered_from < month:
                    pieces.append((Bucket.DAY, uncovered_from, month, 1))
                pieces.append((Bucket.MONTH, month, rolled_until, 1))
                uncovered_from = rolled_until
            elif start - month < rolled_until - start:
                pieces.append((Bucket.MONTH, month, rolled_until, 1))
                pieces.append((Bucket.DAY, month, start, -1))
                uncovered_from = rolled_until
        month = next_month
    if uncovered_from < end:
        pieces.append((Bucket.DAY, uncovered_from, end, 1))
    return pieces


def _signed_covering(start: datetime, end: datetime) -> tuple[Q, Q]:
    """The rows `covering` names, and those of them to subtract."""
    mark = MonthlyRollupMark.objects.values_list("rolled_until", flat=True).first()
    rows, subtracted = Q(pk__in=[]), Q(pk__in=[])
    for bucket, since, until, sign in covering(start, end, mark):
        if bucket == Bucket.MONTH:
            piece = Q(bucket=bucket, bucket_start=since)
        else:
            piece = Q(bucket=bucket, bucket_start__gte=since, bucket_start__lt=until)
        rows |= piece
        if sign < 0:
            subtracted |= piece
    return rows, subtracted


def _rollups(tenant, query: CostQuery, *, jobs: bool = True, by_day: bool = False) -> QuerySet:
    """The rows in the query's range and filters: the job rollups, or (`jobs=False`, when
    neither the grouping nor a filter is about jobs or projects) the much smaller daily
    totals. Job rollups are daily rows if `by_day`, else whole months' rows where they
    cover the range (a year by job is some 12 rows per job, not 365). Each row carries
    its `sign` (-1 for days subtracted from a month), which the sums apply."""
    if query.group_by not in GROUP_BY:
        raise ServiceError(
            f"Unknown group-by “{query.group_by}”; use one of {', '.join(GROUP_BY)}.",
            field="group_by",
        )
    if query.end <= query.start:
        raise ServiceError("The end is before the start.", field="end")
    if query.end - query.start > MAX_RANGE + timedelta(days=1):
        raise ServiceError("A range is at most two years.", field="end")
    # Job-level rows (rollups and meters) or the per-day totals: the same columns.
    rollups: QuerySet[Any]
    if jobs or query.group_by in ("job", "project") or query.job_contains or query.project:
        rollups = LiveUsageRollup.objects.for_tenant(tenant)
        if by_day:
            rollups = rollups.filter(
                bucket=Bucket.DAY, bucket_start__gte=query.start, bucket_start__lt=query.end
            ).annotate(sign=Value(1))
        else:
            rows, subtracted = _signed_covering(query.start, query.end)
            rollups = rollups.filter(rows).annotate(
                sign=Case(When(subtracted, then=Value(-1)), default=Value(1))
            )
    else:
        rollups = UsageDailyTotal.objects.for_tenant(tenant).filter(
            bucket_start__gte=query.start, bucket_start__lt=query.end
        )
        rollups = rollups.annotate(sign=Value(1))
    if query.gpu_type:
        rollups = rollups.filter(gpu_type=query.gpu_type)
    if query.region:
        rollups = rollups.filter(region=query.region)
    if query.tier:
        rollups = rollups.filter(tier=query.tier)
    if query.job_contains:
        rollups = rollups.filter(job_name__icontains=query.job_contains)
    if query.project:  # only job-level rows are read when a project is asked for
        rollups = rollups.filter(project=query.project)  # type: ignore[misc]
    return rollups


def _key(value) -> str:
    return value.date().isoformat() if isinstance(value, datetime) else str(value)


def _signed_sum(field: str) -> Sum:
    return Sum(F(field) * F("sign"), output_field=DecimalField(max_digits=30, decimal_places=9))


SUMS = {
    name: _signed_sum(name) for name in ("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount")
}
# A group whose usage lies wholly in days subtracted from a month sums to nothing: it
# had no usage in the range, and is not shown. Storage is billed by GiB-hour, not compute
# time: its groups show by their amount.
USED = ~Q(gpu_seconds=0, cpu_seconds=0, amount=0)


def _cells(tenant, query: CostQuery, *dimensions: str, only: dict | None = None) -> list[dict]:
    """The rollups summed per distinct value of `dimensions` (one grouped query), limited
    to the rows matching `only` if given; "day" is the bucket's date (a date is much
    cheaper to read than a timestamp with a zone)."""
    by_day = "day" in dimensions or GROUP_BY["day"] in dimensions  # months have no days
    # Validates the query, group_by included.
    rollups = _rollups(tenant, query, jobs=False, by_day=by_day)
    if only:
        rollups = rollups.filter(**only)
    if by_day:
        rollups = rollups.annotate(day=TruncDate("bucket_start", tzinfo=UTC))
    cells = rollups.values(*dict.fromkeys(dimensions)).annotate(**SUMS)
    return list(cells.filter(USED).order_by())


def _days(query: CostQuery) -> list[str]:
    days = []
    day = query.start
    while day < query.end:
        days.append(day.date().isoformat())
        day += timedelta(days=1)
    return days


def _usage_rows_from(cells: list[dict], field: str) -> list[dict]:
    totals: dict[tuple[str, str], list[Decimal]] = {}
    for cell in cells:
        sums = totals.setdefault((_key(cell[field]), cell["currency"]), [Decimal(0)] * 4)
        for i, name in enumerate(SUMS):
            sums[i] += cell[name]
    return [
        {
            "key": key,
            "gpu_seconds": gpu_seconds,
            "cpu_seconds": cpu_seconds,
            "gpu_hours": gpu_seconds / HOUR,
            "cpu_hours": cpu_seconds / HOUR,
            "amount": amount,
            "on_demand_amount": on_demand_amount,
            "currency": currency,
        }
        for (key, currency), (gpu_seconds, cpu_seconds, amount, on_demand_amount) in sorted(
            totals.items()
        )
    ]


def _series_from(
    cells: list[dict], field: str, days: list[str]
) -> tuple[list[str], dict[str, list[Decimal]]]:
    series: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0)] * len(days))
    index = {d: i for i, d in enumerate(days)}
    positions: dict[date, int] = {}  # a few distinct days among many cells
    for cell in cells:
        day = cell["day"]
        position = positions.get(day)
        if position is None:
            position = positions[day] = index[_key(day)]
        series[_key(cell[field])][position] += cell["amount"]
    return days, dict(sorted(series.items()))


def _tier_split_from(cells: list[dict]) -> dict:
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    on_demand: dict[str, Decimal] = defaultdict(Decimal)
    for cell in cells:
        amounts[cell["tier"]] += cell["amount"]
        on_demand[cell["tier"]] += cell["on_demand_amount"]
    return {
        "by_tier": dict(amounts),
        "spot_savings": on_demand.get("spot", Decimal(0)) - amounts.get("spot", Decimal(0)),
        "all_savings": sum((on_demand[t] - amounts[t] for t in amounts), Decimal(0)),
    }


def _value_from(cells: list[dict]) -> list[dict]:
    sums: dict[str, list[Decimal]] = {}
    for cell in cells:
        if cell["gpu_type"] != "cpu":
            found = sums.setdefault(cell["gpu_type"], [Decimal(0), Decimal(0)])
            found[0] += cell["amount"]
            found[1] += cell["gpu_seconds"]
    tflops = dict(GpuType.objects.filter(slug__in=sums).values_list("slug", "peak_tflops"))
    rows = []
    for gpu_type, (amount, gpu_seconds) in sorted(sums.items()):
        gpu_hours = gpu_seconds / HOUR if gpu_seconds else Decimal(0)
        per_gpu_hour = amount / gpu_hours if gpu_hours else None
        peak = tflops.get(gpu_type)
        rows.append(
            {
                "gpu_type": gpu_type,
                "amount": amount,
                "gpu_hours": gpu_hours,
                "per_gpu_hour": per_gpu_hour,
                "per_pflop_hour": per_gpu_hour * 1000 / peak if per_gpu_hour and peak else None,
            }
        )
    return rows


def usage_rows(*, tenant, query: CostQuery) -> list[dict]:
    """{key, gpu_seconds, cpu_seconds, amount, on_demand_amount, currency} per group."""
    field = GROUP_BY.get(query.group_by, "")
    return _usage_rows_from(_cells(tenant, query, field, "currency"), field)


def daily_by_group(*, tenant, query: CostQuery) -> tuple[list[str], dict[str, list[Decimal]]]:
    """Days of the range and, per group, the cost of each day (zeros filled in)."""
    field = GROUP_BY.get(query.group_by, "")
    return _series_from(_cells(tenant, query, "day", field), field, _days(query))


def top_jobs(*, tenant, query: CostQuery, limit: int = 10) -> list[dict]:
    rows = (
        _rollups(tenant, query)
        .values("job_ref", "job_name")
        .annotate(**{name: SUMS[name] for name in ("amount", "gpu_seconds", "cpu_seconds")})
        .filter(USED)
        .order_by("-amount", "job_ref")[:limit]
    )
    return list(rows)


def tier_split(*, tenant, query: CostQuery) -> dict:
    """Spot vs other tiers, and what spot saved against on-demand prices."""
    return _tier_split_from(_cells(tenant, query, "tier"))


@dataclass(frozen=True)
class CostExplorer:
    """Everything the Cost Explorer's charts and tables show for one query."""

    rows: list[dict]
    days: list[str]
    series: dict[str, list[Decimal]]
    split: dict
    value: list[dict]
    top: list[dict]


def cost_explorer(*, tenant, query: CostQuery) -> CostExplorer:
    """The table, the tier split and the value per GPU type from one grouped query, the
    daily chart from another (each derived by the same rule as its own selector above),
    plus the top jobs. Two queries rather than one keep the daily cells to day × group:
    grouped by job over 90 days that is already 45,000 rows."""
    field = GROUP_BY.get(query.group_by, "")
    cells = _cells(tenant, query, field, "tier", "gpu_type", "currency")
    days, series = _stacked_daily(tenant, query, field, cells)
    return CostExplorer(
        rows=_usage_rows_from(cells, field),
        days=days,
        series=series,
        split=_tier_split_from(cells),
        value=_value_from(cells),
        top=top_jobs(tenant=tenant, query=query),
    )


def _stacked_daily(
    tenant, query: CostQuery, field: str, cells: list[dict]
) -> tuple[list[str], dict[str, list[Decimal]]]:
    """The daily chart's series: every group's, or, with more than MAX_STACKED_SERIES
    groups, the costliest ones' (in their usual order) plus "Other (n)" for the rest,
    which is each day's total less theirs: the stack's daily totals stay the same and
    only the kept groups' days are read (not 90 days × 500 jobs)."""
    days = _days(query)
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    for cell in cells:
        amounts[_key(cell[field])] += cell["amount"]
    if len(amounts) <= MAX_STACKED_SERIES or query.group_by == "day":
        # Grouped by day, each day is its own bar already.
        return _series_from(_cells(tenant, query, "day", field), field, days)
    ranked = sorted(amounts, key=lambda key: (-amounts[key], key))
    kept = ranked[: MAX_STACKED_SERIES - 1]
    top = _cells(tenant, query, "day", field, only={f"{field}__in": kept})
    _, series = _series_from(top, field, days)
    index = {day: i for i, day in enumerate(days)}
    other = [Decimal(0)] * len(days)
    for cell in _cells(tenant, replace(query, group_by="day"), "day"):
        other[index[_key(cell["day"])]] += cell["amount"]
    for values in series.values():
        for i, amount in enumerate(values):
            other[i] -= amount
    series[f"Other ({len(amounts) - len(kept)})"] = other
    return days, series


def cumulative_month(
    *, tenant, now: datetime | None = None, project: str = ""
) -> tuple[list[str], list[Decimal]]:
    """Month-to-date cumulative spend per day."""
    now = now or timezone.now()
    tomorrow = datetime.combine(
        now.astimezone(UTC).date() + timedelta(days=1), time.min, tzinfo=UTC
    )
    query = CostQuery(start=period_start(now), end=tomorrow, group_by="day", project=project)
    days, series = daily_by_group(tenant=tenant, query=query)
    daily = [sum(values[i] for values in series.values()) for i in range(len(days))]
    running, cumulative = Decimal(0), []
    for amount in daily:
        running += amount
        cumulative.append(running)
    return days, cumulative


def job_costs(jobs: list) -> dict[int, Decimal]:
    """Ledger cost of each job, in one query."""
    totals = dict(
        UsageRecord.objects.filter(job_ref__in=[j.pk for j in jobs])
        .values("job_ref")
        .annotate(s=Sum("amount"))
        .values_list("job_ref", "s")
    )
    return {job.pk: Decimal(totals.get(job.pk) or 0) for job in jobs}


def price_gaps(limit: int = 20) -> list[dict]:
    """Usage recorded at zero for want of a price (the staff's alert), per GPU type and
    region, latest first: {gpu_type, region, first, last, records, note}. Not tenant data:
    no tenant, job or amount leaves here. Read through the partial index of noted
    records."""
    return [
        {
            "gpu_type": row["gpu_type__slug"] or "cpu",
            "region": row["region__slug"],
            "first": row["first"],
            "last": row["last"],
            "records": row["records"],
            "note": row["note"],
        }
        for row in UsageRecord.objects.exclude(note="")
        .values("gpu_type__slug", "region__slug")
        .annotate(
            first=Min("interval_start"),
            last=Max("interval_end"),
            records=Count("pk"),
            note=Max("note"),
        )
        .order_by("-last")[:limit]
    ]
