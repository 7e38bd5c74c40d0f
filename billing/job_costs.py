"""What jobs cost, for their pages and the job API: cost to date (the ledger plus the
running time not metered yet) and run rates, each configuration priced once.

Registered with jobs as its cost provider (`BillingConfig.ready`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from operator import attrgetter

from django.db.models import (
    Count,
    F,
    Min,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
)
from django.utils import timezone

from billing.metering.spans import billed_spans
from billing.models import UsageRecord
from console.models import Tenant
from jobs.models import BILLED_STATUSES, Job, JobEvent
from jobs.selectors import job_events, job_from_row
from marketplace.price_book_cache import PriceBook, price_book
from marketplace.pricing import after_tenant_discount, tenant_discount_percent

COST_QUANTUM = Decimal("0.000001")


def billed_seconds(
    job: Job,
    events: list[JobEvent] | None = None,
    now: datetime | None = None,
    since: datetime | None = None,
) -> float:
    """Seconds spent holding paid compute (after `since`), from the job's own timeline."""
    now = now or timezone.now()
    events = events if events is not None else list(job_events(job=job))
    changes = [e for e in events if e.to_status != e.from_status]
    start = since or (changes[0].at if changes else now)
    return sum((s.end - s.start).total_seconds() for s in billed_spans(changes, start, now))


def job_run_rate(job: Job) -> Decimal | None:
    """The job's hourly price (its actual spot/on-demand split), or None without a price."""
    return jobs_run_rates([job])[job.pk]


# What a job's hourly price depends on: jobs alike in these are priced once (a tenant's
# hundreds of running jobs share a handful of configurations).
PRICED_BY = ("gpu_type_id", "region_id", "tenant_id", "gpus_per_node", "cpus", "nodes",
             "spot_nodes")  # fmt: skip
_priced_by = attrgetter(*PRICED_BY)


def jobs_run_rates(jobs) -> dict[int, Decimal | None]:
    """Each job's hourly price, from the price book in force as offers read it (kept in
    memory: marketplace.price_book_cache) after its tenant's discount: a constant number of
    queries, however many configurations. None for a job without a price."""
    if not jobs:
        return {}
    book = price_book()
    discounts = {
        tenant_id: tenant_discount_percent(Tenant(pk=tenant_id))
        for tenant_id in {job.tenant_id for job in jobs}
    }
    by_configuration: dict[tuple, Decimal | None] = {}
    rates = {}
    for job in jobs:
        key = _priced_by(job)
        if key not in by_configuration:
            by_configuration[key] = _run_rate(job, book, discounts[job.tenant_id])
        rates[job.pk] = by_configuration[key]
    return rates


def _run_rate(job: Job, book: PriceBook | None, discount: Decimal) -> Decimal | None:
    # The hourly figure of `marketplace.pricing.estimate_cost` (before its rounding to
    # the cent) for the job's own split, which `marketplace.pricing.node_split` made.
    offer = (job.gpu_type_id, job.region_id)
    prices = book.prices_by_offer.get(offer) if book is not None else None
    units_per_node = job.gpus_per_node if job.gpu_type_id else job.cpus
    if prices is None or job.nodes < 1 or not units_per_node or units_per_node < 1:
        return None
    spot = after_tenant_discount(prices.spot, discount)
    on_demand = after_tenant_discount(prices.on_demand, discount)
    return units_per_node * (spot * job.spot_nodes + on_demand * job.on_demand_nodes)


def total_run_rate(jobs: QuerySet[Job]) -> Decimal:
    """The summed hourly price of the given jobs, in a few queries whatever their number:
    how many jobs share each configuration, and one job of each to price."""
    groups = list(jobs.order_by().values(*PRICED_BY).annotate(count=Count("pk"), one=Min("pk")))
    examples = Job.objects.in_bulk([group["one"] for group in groups])
    rates = jobs_run_rates(list(examples.values()))
    total = Decimal(0)
    for group in groups:
        total += (rates[group["one"]] or Decimal(0)) * group["count"]
    return total


def jobs_costs_to_date(
    jobs: list[Job],
    now: datetime | None = None,
    rates: dict[int, Decimal | None] | None = None,
) -> dict[int, Decimal]:
    """Cost to date of many jobs with a constant number of queries: the ledger, plus
    the running time not metered yet priced at each job's current rate (so the figure
    moves live between metering ticks). `rates`: `jobs_run_rates` of the jobs, when the
    caller has read them already."""
    if not jobs:
        return {}
    if all(job.started_at is None for job in jobs):  # e.g. a launch's answer: nothing ran
        return {job.pk: Decimal(0).quantize(COST_QUANTUM) for job in jobs}
    now = now or timezone.now()
    ledger, meters = _ledger_and_meters(jobs)
    live = [j for j in jobs if not _settled(j.started_at, j.status, meters.get(j.pk))]
    events: dict[int, list[JobEvent]] = {j.pk: [] for j in live}
    for event in JobEvent.objects.filter(job__in=live).order_by("job_id", "at", "pk"):
        events[event.job_id].append(event)
    if rates is None:
        rates = jobs_run_rates(live)
    costs = {}
    for job in jobs:
        total = ledger[job.pk]
        if job.pk in events:
            seconds = billed_seconds(
                job, events[job.pk], now=now, since=meters.get(job.pk) or job.started_at
            )
            total += (rates[job.pk] or Decimal(0)) * Decimal(str(round(seconds, 3))) / 3600
        costs[job.pk] = total.quantize(COST_QUANTUM)
    return costs


def _settled(started_at: datetime | None, status: str, metered_until: datetime | None) -> bool:
    """Whether the ledger alone is the job's cost: it never ran, or it stopped paying
    and metering has closed its time (else the time since is priced live)."""
    return started_at is None or (status not in BILLED_STATUSES and metered_until is not None)


def rows_costs_to_date(rows: list[dict]) -> dict[int, Decimal]:
    """`jobs_costs_to_date` of a list page's `values()` rows read `with_cost_inputs`:
    a settled job's cost is its ledger total; only the others become model instances
    (a page of finished jobs costs no query and no instance)."""
    costs, live = {}, []
    for row in rows:
        if _settled(row["started_at"], row["status"], row[METERED_UNTIL]):
            costs[row["id"]] = Decimal(row[LEDGER_TOTAL] or 0).quantize(COST_QUANTUM)
        else:
            live.append(job_from_row(row))
    costs.update(jobs_costs_to_date(live))
    return costs


# A list page reads each job's ledger total and metering cursor with its row
# (`with_cost_inputs`) instead of in a query of its own.
LEDGER_TOTAL = "cost_ledger_total"
METERED_UNTIL = "cost_metered_until"


def with_cost_inputs(jobs: QuerySet[Job]) -> QuerySet[Job]:
    ledger_total = (
        UsageRecord.objects.filter(job=OuterRef("pk"))
        .order_by()
        .values("job")
        .annotate(total=Sum("amount"))
        .values("total")
    )
    return jobs.annotate(
        **{LEDGER_TOTAL: Subquery(ledger_total), METERED_UNTIL: F("meter__metered_until")}
    )


def _ledger_and_meters(jobs: list[Job]) -> tuple[dict[int, Decimal], dict[int, datetime]]:
    """Each job's ledger total and metering cursor: read with the rows, or in one query
    (a job page's cost)."""
    rows: Iterable[tuple[int, datetime | None, Decimal | None]]
    if all(hasattr(job, LEDGER_TOTAL) for job in jobs):
        rows = [(job.pk, getattr(job, METERED_UNTIL), getattr(job, LEDGER_TOTAL)) for job in jobs]
    else:
        read = with_cost_inputs(Job.objects.filter(pk__in=[job.pk for job in jobs]))
        rows = read.values_list("pk", METERED_UNTIL, LEDGER_TOTAL)
    ledger: dict[int, Decimal] = {job.pk: Decimal(0) for job in jobs}
    meters: dict[int, datetime] = {}
    for pk, metered_until, amount in rows:
        ledger[pk] = Decimal(amount or 0)
        if metered_until is not None:
            meters[pk] = metered_until
    return ledger, meters


class BillingJobCosts:
    """jobs.extensions.JobCostProvider, answered from the ledger and the price book."""

    cost_columns = ("id", "status", "started_at", *PRICED_BY, "on_demand_nodes")

    def with_cost_inputs(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        return with_cost_inputs(jobs)

    def costs_to_date(
        self, jobs: list[Job], *, rates: dict[int, Decimal | None] | None = None
    ) -> dict[int, Decimal]:
        return jobs_costs_to_date(jobs, rates=rates)

    def row_costs(self, rows: list[dict]) -> dict[int, Decimal]:
        return rows_costs_to_date(rows)

    def run_rate(self, job: Job) -> Decimal | None:
        return job_run_rate(job)

    def run_rates(self, jobs: list[Job]) -> dict[int, Decimal | None]:
        return jobs_run_rates(jobs)
