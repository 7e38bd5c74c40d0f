"""Reads for jobs; every tenant read goes through `for_tenant`."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import QuerySet
from django.utils import timezone

from jobs.models import Job, JobEvent, JobStatus
from marketplace.pricing import PricingError, estimate_cost

S = JobStatus
# Billing runs from `running` until compute is released (pausing still holds it).
BILLED_STATUSES = frozenset({S.RUNNING, S.PAUSING})
COST_QUANTUM = Decimal("0.000001")


def jobs_for_tenant(*, tenant, status: str | None = None, query: str = "") -> QuerySet[Job]:
    jobs = Job.objects.for_tenant(tenant).select_related(
        "gpu_type", "region", "image", "created_by"
    )
    if status:
        jobs = jobs.filter(status=status)
    if query:
        jobs = jobs.filter(name__icontains=query)
    return jobs


def job_events(*, job: Job) -> QuerySet[JobEvent]:
    return JobEvent.objects.filter(job=job).order_by("at", "pk")


def billed_seconds(
    job: Job, events: list[JobEvent] | None = None, now: datetime | None = None
) -> float:
    """Seconds spent holding paid compute, from the job's own timeline."""
    now = now or timezone.now()
    events = events if events is not None else list(job_events(job=job))
    total, since = 0.0, None
    for event in events:
        if event.to_status == event.from_status:
            continue
        if event.to_status in BILLED_STATUSES and since is None:
            since = event.at
        elif event.to_status not in BILLED_STATUSES and since is not None:
            total += (event.at - since).total_seconds()
            since = None
    if since is not None:
        total += (now - since).total_seconds()
    return total


def job_run_rate(job: Job) -> Decimal | None:
    """The job's hourly price (its actual spot/on-demand split), or None without a price."""
    try:
        estimate = estimate_cost(
            gpu_type=job.gpu_type,
            region=job.region,
            nodes=job.nodes,
            gpus_per_node=job.gpus_per_node,
            cpus=job.cpus,
            spot_ratio=Decimal(job.spot_nodes) / Decimal(job.nodes),
            hours=Decimal(1),
            tenant=job.tenant,
        )
    except PricingError:
        return None
    return estimate.unit_price_spot * Decimal(estimate.units) * Decimal(job.spot_nodes) / Decimal(
        job.nodes
    ) + estimate.unit_price_base * Decimal(estimate.units) * Decimal(job.on_demand_nodes) / Decimal(
        job.nodes
    )


def job_cost_to_date(job: Job, events: list[JobEvent] | None = None) -> Decimal:
    """Cost so far from the job's timeline and current prices (per-second billing).

    Until the metering ledger (billing) records usage, this is the figure shown."""
    rate = job_run_rate(job)
    if rate is None:
        return Decimal(0).quantize(COST_QUANTUM)
    seconds = Decimal(str(round(billed_seconds(job, events), 3)))
    return (rate * seconds / Decimal(3600)).quantize(COST_QUANTUM)
