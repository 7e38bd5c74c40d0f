"""Lost work in money: the GPU-seconds an invoice line's usage spent redoing work after a
preemption, since the job's last complete checkpoint.

Each requeued attempt of a job (a `JobResume` of start 0 after attempt 1) records the
seconds between its last checkpoint and the interruption (`lost_seconds`); every GPU the
new attempt runs on, on each tier, redoes that much. The figure goes on the line that
holds that attempt's first usage record on the tier, so it is counted once even when the
attempt's usage spans two lines (a price change) or two invoices (a month's end).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from functools import reduce
from operator import or_
from typing import Any

from django.db.models import Min, Q, QuerySet

from billing.models import UsageRecord
from jobs.models import JobResume

REDONE_QUANTUM = Decimal("0.001")

# What `services.usage_lines` groups records by: a line's key.
LINE_KEY = (
    "gpu_type__slug",
    "tier",
    "region__slug",
    "price_version_id",
    "unit_price",
    "discount_percent",
    "currency",
    "late",
)


def line_key(row: Mapping[str, Any]) -> tuple:
    return tuple(row[name] for name in LINE_KEY)


def redone_gpu_seconds(
    records: QuerySet[UsageRecord], *, period_start: datetime
) -> dict[tuple, Decimal]:
    """GPU-seconds redone per line key (only lines with some), exact Decimals."""
    gpu_records = records.filter(gpu_type__isnull=False, job__isnull=False)
    # The jobs come from the (tenant-scoped) records: their resumes are the tenant's.
    resumes = {
        (job_id, attempt): Decimal(str(lost)).quantize(REDONE_QUANTUM)
        for job_id, attempt, lost in JobResume.objects.filter(
            job_id__in=gpu_records.values("job_id"),
            start=0,
            attempt__gt=1,
            lost_seconds__gt=0,
        ).values_list("job_id", "attempt", "lost_seconds")
    }
    if not resumes:
        return {}
    attempts = reduce(or_, (Q(job_id=job, attempt=attempt) for job, attempt in resumes))
    firsts = list(
        UsageRecord.objects.filter(attempts, gpu_type__isnull=False)
        .values("job_id", "attempt", "tier")
        .annotate(first=Min("interval_start"))
    )
    if not firsts:
        return {}
    first_records = reduce(
        or_,
        (
            Q(job_id=row["job_id"], attempt=row["attempt"], tier=row["tier"])
            & Q(interval_start=row["first"])
            for row in firsts
        ),
    )
    redone: dict[tuple, Decimal] = {}
    rows = (
        gpu_records.filter(first_records)
        .annotate(late=Q(interval_start__lt=period_start))
        .values(*LINE_KEY, "job_id", "attempt", "units")
    )
    for row in rows:
        key = line_key(row)
        redone[key] = (
            redone.get(key, Decimal(0)) + resumes[(row["job_id"], row["attempt"])] * row["units"]
        )
    return redone
