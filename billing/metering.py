"""Metering: turn jobs' running time into priced, contiguous, unique usage records.

One tick (`meter_tick`) runs in one transaction with the candidate jobs locked, so two
ticks can't write the same interval; the unique key (job, attempt, tier, interval start)
backs that up. The number of queries is constant whatever the number of jobs.

A job is billed from the moment it is running until its compute is released
(`running` and `pausing`); queueing, provisioning and paused time are not billed.
Intervals are split at hour boundaries and at price-version changes, so each record is
priced by the version in force when it ran and rolls up into one hour.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from billing.models import AMOUNT_QUANTUM, Bucket, JobMeter, UsageRecord, UsageRollup
from jobs.models import Job, JobEvent, JobStatus
from marketplace.models import PriceVersion, TenantPricing, Tier
from marketplace.pricing import unit_prices

log = logging.getLogger(__name__)
S = JobStatus
BILLED = frozenset({S.RUNNING, S.PAUSING})
SECONDS_QUANTUM = Decimal("0.001")
BATCH = 1000
HUNDRED = Decimal(100)


@dataclass(frozen=True)
class Span:
    start: datetime
    end: datetime
    attempt: int


def billed_spans(events: list[JobEvent], since: datetime, until: datetime) -> list[Span]:
    """Billed time of one job between `since` and `until`, from its status events."""
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
    """Cut a span at hour boundaries and at the given instants (price changes)."""
    points = {p for p in cut_points if span.start < p < span.end}
    hour = span.start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    while hour < span.end:
        points.add(hour)
        hour += timedelta(hours=1)
    edges = [span.start, *sorted(points), span.end]
    return [Span(a, b, span.attempt) for a, b in pairwise(edges)]


class _PriceBook:
    """Every version, loaded once per tick (a small table)."""

    def __init__(self) -> None:
        self.versions = list(
            PriceVersion.objects.prefetch_related("entries").order_by("effective_from", "pk")
        )
        self.change_points = [v.effective_from for v in self.versions]
        self.discounts = dict(TenantPricing.objects.values_list("tenant_id", "discount_percent"))

    def version_at(self, at: datetime) -> PriceVersion | None:
        found = None
        for version in self.versions:
            if version.effective_from <= at:
                found = version
        return found

    def prices(self, job: Job, at: datetime):
        version = self.version_at(at)
        if version is None:
            return None, None
        entry = next(
            (
                e
                for e in version.entries.all()
                if e.gpu_type_id == job.gpu_type_id and e.region_id == job.region_id
            ),
            None,
        )
        return version, unit_prices(entry, version) if entry else None


def _tiers(job: Job) -> list[tuple[str, int]]:
    """(tier, units) shares of a job: each node billed at its actual tier."""
    per_node = job.gpus_per_node if job.gpu_type_id else job.cpus
    base_tier = job.pool.tier if job.pool_id else Tier.ON_DEMAND
    shares = [(base_tier, job.on_demand_nodes * per_node), (Tier.SPOT, job.spot_nodes * per_node)]
    return [(tier, units) for tier, units in shares if units > 0]


def _records_for(job: Job, spans: list[Span], book: _PriceBook) -> list[UsageRecord]:
    records = []
    discount = book.discounts.get(job.tenant_id, Decimal(0))
    for piece in (p for span in spans for p in _split(span, book.change_points)):
        seconds = Decimal(str((piece.end - piece.start).total_seconds()))
        version, prices = book.prices(job, piece.start)
        for tier, units in _tiers(job):
            unit_seconds = (seconds * units).quantize(SECONDS_QUANTUM)
            note = ""
            if prices is None:
                what = job.gpu_type.slug if job.gpu_type_id else "CPU"
                note = f"no price for {what} in {job.region.slug} at {piece.start:%Y-%m-%d %H:%M}"
                unit_price = on_demand_price = Decimal(0)
                log.error("price book gap: %s (job %s); usage recorded at zero", note, job.pk)
            else:
                unit_price = prices.for_tier(tier) * (HUNDRED - discount) / HUNDRED
                on_demand_price = prices.on_demand * (HUNDRED - discount) / HUNDRED
            records.append(
                UsageRecord(
                    tenant_id=job.tenant_id,
                    job=job,
                    job_ref=job.pk,
                    job_name=job.name,
                    project=job.project,
                    attempt=piece.attempt,
                    tier=tier,
                    gpu_type=job.gpu_type,
                    region=job.region,
                    interval_start=piece.start,
                    interval_end=piece.end,
                    units=units,
                    gpu_seconds=unit_seconds if job.gpu_type_id else Decimal(0),
                    cpu_seconds=Decimal(0) if job.gpu_type_id else unit_seconds,
                    price_version=version,
                    unit_price=unit_price.quantize(AMOUNT_QUANTUM),
                    discount_percent=discount,
                    amount=(unit_seconds * unit_price.quantize(AMOUNT_QUANTUM) / 3600).quantize(
                        AMOUNT_QUANTUM
                    ),
                    on_demand_amount=(unit_seconds * on_demand_price / 3600).quantize(
                        AMOUNT_QUANTUM
                    ),
                    currency=version.currency if version else "USD",
                    note=note,
                )
            )
    return records


@dataclass
class TickResult:
    jobs: int
    records: int
    tenants: set[int]


@transaction.atomic
def meter_tick(*, now: datetime | None = None) -> TickResult:
    now = now or timezone.now()
    jobs = list(
        Job.objects.select_for_update(of=("self",))
        # Billed now, still being metered, or ran and ended before its first tick.
        .filter(
            Q(status__in=BILLED)
            | Q(meter__open=True)
            | Q(meter__isnull=True, started_at__isnull=False)
        )
        .select_related("meter", "gpu_type", "region", "pool")
    )
    if not jobs:
        return TickResult(0, 0, set())
    events_by_job: dict[int, list[JobEvent]] = defaultdict(list)
    for event in (
        JobEvent.objects.filter(job_id__in=[j.pk for j in jobs])
        .exclude(from_status=F("to_status"))
        .order_by("job_id", "at", "pk")
    ):
        events_by_job[event.job_id].append(event)

    new_meters: list[JobMeter] = []
    changed_meters: list[JobMeter] = []
    advanced: list[int] = []
    records: list[UsageRecord] = []
    book = _PriceBook()
    for job in jobs:
        meter = getattr(job, "meter", None)
        events = events_by_job[job.pk]
        is_new = meter is None
        if is_new:
            first = next((e.at for e in events if e.to_status in BILLED), job.started_at or now)
            meter = JobMeter(job=job, metered_until=first, open=True)
            new_meters.append(meter)
        still_billed = job.status in BILLED
        # A job that ended after this tick's clock was read (while we waited for its row
        # lock) is billed to its real end, not cut at `now`.
        until = now if still_billed or not events else max(now, events[-1].at)
        spans = billed_spans(events, meter.metered_until, until)
        records.extend(_records_for(job, spans, book))
        meter.metered_until = (
            now if still_billed else max([meter.metered_until, *[s.end for s in spans]])
        )
        meter.open = still_billed
        if not is_new and still_billed:
            advanced.append(job.pk)
        elif not is_new:
            changed_meters.append(meter)
    JobMeter.objects.bulk_create(new_meters, batch_size=BATCH)
    # Most meters just move to `now`: one UPDATE per batch rather than a CASE per row.
    for start in range(0, len(advanced), 900):  # under SQLite's 999-parameter limit
        JobMeter.objects.filter(job_id__in=advanced[start : start + 900]).update(
            metered_until=now, open=True
        )
    JobMeter.objects.bulk_update(changed_meters, ["metered_until", "open"], batch_size=BATCH)
    # The locked rows and the cursor make a duplicate impossible; the unique key is the
    # last line of defence (and `manage.py rebuild_rollups` repairs rollups from records).
    UsageRecord.objects.bulk_create(records, ignore_conflicts=True, batch_size=BATCH)
    rollups_add(records)
    return TickResult(len(jobs), len(records), {r.tenant_id for r in records})


ROLLUP_KEY = ("tenant_id", "bucket", "bucket_start", "job_ref", "gpu_type", "tier", "region")
ROLLUP_SUMS = ("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount")


def _rollup_rows(records: list[UsageRecord]) -> dict[tuple, dict]:
    rows: dict[tuple, dict] = {}
    for record in records:
        hour = record.interval_start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        for bucket, start in ((Bucket.HOUR, hour), (Bucket.DAY, hour.replace(hour=0))):
            key = (
                record.tenant_id,
                bucket,
                start,
                record.job_ref,
                record.gpu_type.slug if record.gpu_type_id else "cpu",
                record.tier,
                record.region.slug,
            )
            row = rows.setdefault(
                key,
                {
                    "job_name": record.job_name,
                    "project": record.project,
                    "currency": record.currency,
                    **dict.fromkeys(ROLLUP_SUMS, Decimal(0)),
                },
            )
            for field in ROLLUP_SUMS:
                row[field] += getattr(record, field)
    return rows


def rollups_add(records: list[UsageRecord]) -> None:
    """Add new records to the hourly and daily rollups: one upsert statement per batch
    that increments existing rows (INSERT … ON CONFLICT DO UPDATE, on SQLite and
    PostgreSQL alike)."""
    rows = _rollup_rows(records)
    if not rows:
        return
    table = UsageRollup._meta.db_table
    columns = [*ROLLUP_KEY, "job_name", "project", "currency", *ROLLUP_SUMS]
    increments = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in ROLLUP_SUMS)
    items = list(rows.items())
    for chunk_start in range(0, len(items), BATCH):
        chunk = items[chunk_start : chunk_start + BATCH]
        placeholders = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(chunk))
        params: list = []
        for key, row in chunk:
            tenant_id, bucket, start, *rest = key
            # The ORM's own encoding of datetimes, so SQLite text values compare equal.
            params.extend(
                [tenant_id, bucket, connection.ops.adapt_datetimefield_value(start), *rest]
            )
            params.extend([row["job_name"], row["project"], row["currency"]])
            params.extend(str(row[f]) for f in ROLLUP_SUMS)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES {placeholders} "  # noqa: S608
                f"ON CONFLICT ({', '.join(ROLLUP_KEY)}) DO UPDATE SET {increments}",
                params,
            )


@transaction.atomic
def rollups_rebuild(*, tenant_id: int | None = None) -> int:
    """Recompute every rollup from the ledger (a repair tool; the tick never needs it)."""
    rollups = UsageRollup.objects.all()
    records = UsageRecord.objects.select_related("gpu_type", "region")
    if tenant_id is not None:
        rollups, records = rollups.filter(tenant_id=tenant_id), records.filter(tenant_id=tenant_id)
    rollups.delete()
    batch = []
    count = 0
    for record in records.iterator(chunk_size=BATCH):
        batch.append(record)
        if len(batch) >= BATCH:
            rollups_add(batch)
            count += len(batch)
            batch = []
    rollups_add(batch)
    return count + len(batch)
