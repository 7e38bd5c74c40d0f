"""Reads for expected starts and ends: a page of jobs' expectations in a fixed number of
queries (pools, the queue ahead, the jobs holding compute, quotas, suspended tenants,
the runtime history), whatever the page's size."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from console.tenant_admin import suspended_tenant_ids
from jobs.expectations.runtime import (
    RuntimePrediction,
    history_from_rows,
    predict_runtimes,
    similarity_keys,
)
from jobs.expectations.simulation import Holder, Resource, Waiter, simulate_starts
from jobs.expectations.wording import (
    BUDGET_WAIT,
    end_sentence,
    end_summary,
    start_sentence,
    start_summary,
    waiting_because,
)
from jobs.models import HOLDING_COMPUTE, Job, JobStatus
from jobs.selectors import PRIORITY_ORDER, QueuedWork, queued_in_order, queued_work, wanting_pools
from jobs.services.fair_share import (
    FairShare,
    PoolWork,
    job_pool_nodes,
    pool_units,
    predicted_order,
)
from marketplace.models import NodePool, TenantQuota

# Runs older than this don't predict today's (code and data change).
HISTORY_WINDOW = timedelta(days=90)
# At most this many finished runs are read for one page (newest first).
HISTORY_ROWS = 5000
# Jobs further back in the queue than this get no estimate (it would be guesswork).
SIMULATED_QUEUE = 1000

# What a job's expectation reads of it: list pages load these columns.
EXPECTATION_COLUMNS = (
    "tenant_id", "project", "launch_template_id", "image_id", "gpu_type_id",
    "max_runtime_minutes", "status", "wait_kind", "status_reason", "priority",
    "pool_id", "spot_pool_id", "on_demand_nodes", "spot_nodes", "gpus_per_node", "cpus",
    "nodes", "run_seconds", "running_since", "status_changed_at", "created_at",
    "paused_by_budget",
)  # fmt: skip

# The statuses something is expected of (a start, an end, a budget).
EXPECTED_STATUSES = frozenset({JobStatus.QUEUED, *HOLDING_COMPUTE, JobStatus.PAUSED})
# The statuses whose running time is predicted (a paused job's end isn't foreseen).
PREDICTED_STATUSES = frozenset({JobStatus.QUEUED, *HOLDING_COMPUTE})


@dataclass(frozen=True)
class Expectation:
    """What a job page, a list row and the API say of a job's start and end."""

    prediction: RuntimePrediction | None
    expected_start: datetime | None = None
    expected_end: datetime | None = None
    # Queued: why it waits, in words; and how many queued jobs are ahead for its pools.
    because: str = ""
    ahead: int = 0
    # The sentence a page shows ("expected to start ~14:20 (in 35 min), because …").
    sentence: str = ""
    # Its short form, for a row of the jobs list ("starts ~14:20 (in 35 min)").
    summary: str = ""


def job_pool_ids(job: PoolWork) -> list[int]:
    return [pool_id for pool_id in (job.pool_id, job.spot_pool_id) if pool_id]


def _pool_needs(job: PoolWork, pools: dict[int, NodePool]) -> dict[Resource, int]:
    needs: dict[Resource, int] = {}
    for pool_id, nodes in ((job.pool_id, job.on_demand_nodes), (job.spot_pool_id, job.spot_nodes)):
        if pool_id:
            pool = pools.get(pool_id)
            per_node = job.gpus_per_node if pool is None or pool.gpu_type_id else job.cpus
            needs[("pool", pool_id)] = needs.get(("pool", pool_id), 0) + nodes * per_node
    return needs


def _quota_needs(job: PoolWork, quotas: dict[int, list[TenantQuota]]) -> dict[Resource, int]:
    """What `job` takes of its tenant's quotas (as admission's `blocking_wait` counts)."""
    needs: dict[Resource, int] = {}
    for quota in quotas.get(job.tenant_id, []):
        if quota.gpu_type_id is None and quota.max_concurrent_jobs is not None:
            needs[("quota_jobs", quota.pk)] = 1
        covers = quota.gpu_type_id in (None, job.gpu_type_id)
        if quota.max_gpus is not None and job.gpu_type_id and covers:
            needs[("quota_gpus", quota.pk)] = job.total_gpus
    return needs


def _quota_capacity(quotas: dict[int, list[TenantQuota]]) -> dict[Resource, int]:
    capacity: dict[Resource, int] = {}
    for tenant_quotas in quotas.values():
        for quota in tenant_quotas:
            if quota.gpu_type_id is None and quota.max_concurrent_jobs is not None:
                capacity[("quota_jobs", quota.pk)] = quota.max_concurrent_jobs
            if quota.max_gpus is not None:
                capacity[("quota_gpus", quota.pk)] = quota.max_gpus
    return capacity


def expected_end_of_holder(job: PoolWork, prediction: RuntimePrediction, now: datetime) -> datetime:
    """Start of running plus the predicted runtime (less earlier running spans), never
    earlier than now: an overdue job is expected to end any moment. A job still starting
    (dispatching, provisioning) counts from its last status change, so two reads agree."""
    since = job.running_since if job.status == JobStatus.RUNNING else None
    since = since or job.status_changed_at
    end = since + timedelta(seconds=prediction.median_seconds - job.run_seconds)
    return max(end, now)


def runtime_history(jobs: Iterable[PoolWork], *, now: datetime) -> dict:
    """The succeeded runs of the jobs' tenants that share a project, template, image or
    GPU type with one of them (one query), bucketed for `predict_runtime`."""
    jobs = list(jobs)
    if not jobs:
        return {}
    keys = {key for job in jobs for key in similarity_keys(job)}
    match = Q()
    for basis, field_name in (
        ("project", "project"),
        ("launch_template", "launch_template_id"),
        ("image", "image_id"),
        ("gpu_type", "gpu_type_id"),
    ):
        values = {key[2] for key in keys if key[0] == basis}
        if None in values:
            match |= Q(**{f"{field_name}__isnull": True})
        if values - {None}:
            match |= Q(**{f"{field_name}__in": sorted(values - {None}, key=str)})
    rows = (
        Job.objects.filter(
            match,
            tenant_id__in={job.tenant_id for job in jobs},
            status=JobStatus.SUCCEEDED,
            finished_at__gte=now - HISTORY_WINDOW,
            run_seconds__gt=0,
        )
        .order_by("-finished_at", "-pk")
        .values_list(
            "tenant_id", "project", "launch_template_id", "image_id", "gpu_type_id", "run_seconds"
        )[:HISTORY_ROWS]
    )
    return history_from_rows(list(rows))


def _in_admission_order(
    queue: list[QueuedWork], holders: list[QueuedWork], pools: dict
) -> list[QueuedWork]:
    """`queue` (priority, then first come) in the order admission takes it: fair share
    among the organisations of each priority, from what they hold now."""
    if len({(job.priority, job.tenant_id) for job in queue}) == len({j.priority for j in queue}):
        return queue  # one organisation per priority: first come, first served
    held: dict[tuple[int, int], int] = defaultdict(int)
    for job in holders:
        for pool_id, nodes in job_pool_nodes(job):
            if pool_id in pools and nodes:
                held[(job.tenant_id, pool_id)] += pool_units(job, nodes)
    weights = {job.tenant_id: float(job.fair_share_weight) for job in queue}
    fair = FairShare(pools, held, weights)
    return predicted_order(queue, fair)


def job_expectations(jobs: Sequence[Job], *, now: datetime | None = None) -> dict[int, Expectation]:
    """Expected start (queued jobs), expected end (queued and running jobs) and the
    runtime prediction of each of `jobs`; other jobs get an empty expectation."""
    now = now or timezone.now()
    targets = [job for job in jobs if job.status == JobStatus.QUEUED]
    queue: list[QueuedWork] = []
    holders: list[QueuedWork] = []
    pools: dict[int, NodePool] = {}
    quotas: dict[int, list[TenantQuota]] = defaultdict(list)
    suspended: set[int] = set()
    if targets:
        pool_ids = sorted({pid for job in targets for pid in job_pool_ids(job)})
        pools = {p.pk: p for p in NodePool.objects.filter(pk__in=pool_ids, is_active=True)}
        queue = queued_work(queued_in_order().filter(wanting_pools(pool_ids))[:SIMULATED_QUEUE])
        tenants = {job.tenant_id for job in queue} | {job.tenant_id for job in targets}
        holders = queued_work(
            Job.objects.holding_compute().filter(wanting_pools(pool_ids) | Q(tenant_id__in=tenants))
        )
        for quota in TenantQuota.objects.filter(tenant_id__in=tenants).order_by("pk"):
            quotas[quota.tenant_id].append(quota)
        suspended = suspended_tenant_ids()
        queue = _in_admission_order(queue, holders, pools)
    # Only queued and holding jobs are predicted: a page of finished jobs reads no history.
    predicted = [job for job in jobs if job.status in PREDICTED_STATUSES]
    history = runtime_history([*predicted, *queue, *holders], now=now)
    predictions = predict_runtimes([*queue, *holders, *predicted], history)

    starts: dict[int, float | None] = {}
    ahead: dict[int, tuple[int, int]] = {}
    if targets:
        capacity = {
            ("pool", p.pk): p.allocatable_gpus if p.gpu_type_id else p.allocatable_vcpus
            for p in pools.values()
        }
        capacity.update(_quota_capacity(quotas))
        simulated_holders = [
            Holder(
                needs={**_pool_needs(job, pools), **_quota_needs(job, quotas)},
                ends_in=(
                    expected_end_of_holder(job, predictions[job.pk], now) - now
                ).total_seconds(),
            )
            for job in holders
        ]
        waiters = []
        seen: list[tuple[set[int], int]] = []
        target_ids = {job.pk for job in targets}
        for job in queue:
            wanted = set(job_pool_ids(job))
            if job.pk in target_ids:
                rank = PRIORITY_ORDER.index(job.priority)
                earlier = [r for pids, r in seen if pids & wanted]
                ahead[job.pk] = (len(earlier), sum(1 for r in earlier if r < rank))
            seen.append((wanted, PRIORITY_ORDER.index(job.priority)))
            if job.tenant_id in suspended:
                continue  # waits without holding anyone back
            waiters.append(
                Waiter(
                    job_id=job.pk,
                    pool_needs=_pool_needs(job, pools),
                    quota_needs=_quota_needs(job, quotas),
                    runtime=predictions[job.pk].median_seconds,
                    own_order=frozenset((job.tenant_id, pid) for pid in wanted),
                )
            )
        starts = simulate_starts(
            capacity=capacity, holders=simulated_holders, queue=waiters, wanted=target_ids
        )

    expectations: dict[int, Expectation] = {}
    for job in jobs:
        if job.status == JobStatus.QUEUED:
            prediction = predictions[job.pk]
            offset = starts.get(job.pk)
            start = None if offset is None else now + timedelta(seconds=offset)
            count, higher = ahead.get(job.pk, (0, 0))
            because = waiting_because(job, count, higher)
            expectations[job.pk] = Expectation(
                prediction=prediction,
                expected_start=start,
                expected_end=None
                if start is None
                else start + timedelta(seconds=prediction.median_seconds),
                because=because,
                ahead=count,
                sentence=start_sentence(start, because, now),
                summary=start_summary(start, now),
            )
        elif job.status in HOLDING_COMPUTE:
            prediction = predictions[job.pk]
            end = expected_end_of_holder(job, prediction, now)
            expectations[job.pk] = Expectation(
                prediction=prediction,
                expected_end=end,
                sentence=end_sentence(end, prediction, now),
                summary=end_summary(end, now),
            )
        elif job.status == JobStatus.PAUSED and job.paused_by_budget:
            expectations[job.pk] = Expectation(
                prediction=None,
                because=BUDGET_WAIT,
                sentence=f"paused: {BUDGET_WAIT}",
                summary="waits for its budget",
            )
        else:
            expectations[job.pk] = Expectation(prediction=None)
    return expectations
