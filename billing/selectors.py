"""Reads for the Cost Explorer, job costs and budgets. They read rollups, never raw
usage records (except a job's own cost)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.db.models import QuerySet, Sum
from django.utils import timezone

from billing.models import UsageRecord, UsageRollup
from console.services import ServiceError

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
HOUR = Decimal(3600)


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


def date_range(
    preset: str, *, start: date | None = None, end: date | None = None, today: date | None = None
) -> tuple[datetime, datetime]:
    """[start, end) in UTC for a preset; `end` of a custom range is inclusive."""
    today = today or timezone.now().astimezone(UTC).date()

    def at(day: date) -> datetime:
        return datetime.combine(day, time.min, tzinfo=UTC)

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
        if end < start:
            raise ServiceError("The end date is before the start date.", field="end")
        if at(end) - at(start) > MAX_RANGE:
            raise ServiceError("A range is at most two years.", field="end")
        return at(start), at(end + timedelta(days=1))
    raise ServiceError(f"Unknown range “{preset}”.", field="range")


def _rollups(tenant, query: CostQuery) -> QuerySet[UsageRollup]:
    if query.group_by not in GROUP_BY:
        raise ServiceError(
            f"Unknown group-by “{query.group_by}”; use one of {', '.join(GROUP_BY)}.",
            field="group_by",
        )
    if query.end <= query.start:
        raise ServiceError("The end is before the start.", field="end")
    if query.end - query.start > MAX_RANGE + timedelta(days=1):
        raise ServiceError("A range is at most two years.", field="end")
    rollups = UsageRollup.objects.for_tenant(tenant).filter(
        bucket="day", bucket_start__gte=query.start, bucket_start__lt=query.end
    )
    if query.gpu_type:
        rollups = rollups.filter(gpu_type=query.gpu_type)
    if query.region:
        rollups = rollups.filter(region=query.region)
    if query.tier:
        rollups = rollups.filter(tier=query.tier)
    if query.job_contains:
        rollups = rollups.filter(job_name__icontains=query.job_contains)
    if query.project:
        rollups = rollups.filter(project=query.project)
    return rollups


def _key(value) -> str:
    return value.date().isoformat() if isinstance(value, datetime) else str(value)


def usage_rows(*, tenant, query: CostQuery) -> list[dict]:
    """{key, gpu_seconds, cpu_seconds, amount, on_demand_amount, currency} per group."""
    rows = _rollups(tenant, query)  # validates the query, group_by included
    field = GROUP_BY[query.group_by]
    rows = (
        rows.values(field, "currency")
        .annotate(
            gpu_seconds=Sum("gpu_seconds"),
            cpu_seconds=Sum("cpu_seconds"),
            amount=Sum("amount"),
            on_demand_amount=Sum("on_demand_amount"),
        )
        .order_by(field)
    )
    return [
        {
            "key": _key(row[field]),
            "gpu_seconds": row["gpu_seconds"],
            "cpu_seconds": row["cpu_seconds"],
            "gpu_hours": row["gpu_seconds"] / HOUR,
            "cpu_hours": row["cpu_seconds"] / HOUR,
            "amount": row["amount"],
            "on_demand_amount": row["on_demand_amount"],
            "currency": row["currency"],
        }
        for row in rows
    ]


def daily_by_group(*, tenant, query: CostQuery) -> tuple[list[str], dict[str, list[Decimal]]]:
    """Days of the range and, per group, the cost of each day (zeros filled in)."""
    rollups = _rollups(tenant, query)  # validates the query, group_by included
    field = GROUP_BY[query.group_by]
    days = []
    day = query.start
    while day < query.end:
        days.append(day.date().isoformat())
        day += timedelta(days=1)
    series: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0)] * len(days))
    index = {d: i for i, d in enumerate(days)}
    for row in rollups.values("bucket_start", field).annotate(amount=Sum("amount")):
        series[_key(row[field])][index[_key(row["bucket_start"])]] += row["amount"]
    return days, dict(sorted(series.items()))


def top_jobs(*, tenant, query: CostQuery, limit: int = 10) -> list[dict]:
    rows = (
        _rollups(tenant, query)
        .values("job_ref", "job_name")
        .annotate(amount=Sum("amount"), gpu_seconds=Sum("gpu_seconds"))
        .order_by("-amount")[:limit]
    )
    return list(rows)


def tier_split(*, tenant, query: CostQuery) -> dict:
    """Spot vs other tiers, and what spot saved against on-demand prices."""
    totals = {
        row["tier"]: row
        for row in _rollups(tenant, query)
        .values("tier")
        .annotate(amount=Sum("amount"), on_demand_amount=Sum("on_demand_amount"))
    }
    spot = totals.get("spot", {"amount": Decimal(0), "on_demand_amount": Decimal(0)})
    return {
        "by_tier": {tier: row["amount"] for tier, row in totals.items()},
        "spot_savings": spot["on_demand_amount"] - spot["amount"],
        "all_savings": sum(
            (row["on_demand_amount"] - row["amount"] for row in totals.values()), Decimal(0)
        ),
    }


def value_by_gpu_type(*, tenant, query: CostQuery) -> list[dict]:
    """Cost per GPU-hour and per PFLOP-hour of each GPU type actually used."""
    from marketplace.models import GpuType

    tflops = dict(GpuType.objects.values_list("slug", "peak_tflops"))
    rows = []
    for row in (
        _rollups(tenant, query)
        .exclude(gpu_type="cpu")
        .values("gpu_type")
        .annotate(amount=Sum("amount"), gpu_seconds=Sum("gpu_seconds"))
        .order_by("gpu_type")
    ):
        gpu_hours = row["gpu_seconds"] / HOUR if row["gpu_seconds"] else Decimal(0)
        per_gpu_hour = row["amount"] / gpu_hours if gpu_hours else None
        peak = tflops.get(row["gpu_type"])
        rows.append(
            {
                "gpu_type": row["gpu_type"],
                "amount": row["amount"],
                "gpu_hours": gpu_hours,
                "per_gpu_hour": per_gpu_hour,
                "per_pflop_hour": per_gpu_hour * 1000 / peak if per_gpu_hour and peak else None,
            }
        )
    return rows


def cumulative_month(
    *, tenant, now: datetime | None = None, project: str = ""
) -> tuple[list[str], list[Decimal]]:
    """Month-to-date cumulative spend per day."""
    from billing.services import period_start

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
