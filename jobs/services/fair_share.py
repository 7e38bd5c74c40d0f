"""Fair share of a pool among organisations: among queued jobs of one priority, the
organisation with the lowest weighted dominant share of the pools the job wants goes
first (dominant resource fairness, as Kueue's fair sharing); staff weigh organisations
(`Tenant.fair_share_weight`, default 1).

An organisation's use of a pool is what it holds there now plus the average it held
over the trailing `WINDOW` in work that has ended since, so ending a burst of short jobs
doesn't win its turn back at once. Shares only order admission: they never preempt, so
two organisations' jobs can't take a pool from each other in turn."""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TypeVar

from django.db.models import Q, QuerySet
from django.utils import timezone

from jobs.models import Job
from jobs.selectors import PRIORITY_ORDER, QueuedWork, after_in_queue, wanting_pools
from marketplace.models import NodePool

# What fair share orders: job rows, or the lighter rows the expected-start estimate
# reads its queue as.
PoolWork = Job | QueuedWork
Work = TypeVar("Work", Job, QueuedWork)

WINDOW = timedelta(hours=1)
# A stream's first page: a pass into a full pool stops at its first job, so it reads a
# few rows (growing pages after that), not a chunk of the whole queue.
FIRST_PAGE = 16


def job_pool_nodes(job: PoolWork) -> tuple[tuple[int | None, int], tuple[int | None, int]]:
    """The job's (pool, nodes) pairs: on demand, then spot."""
    return ((job.pool_id, job.on_demand_nodes), (job.spot_pool_id, job.spot_nodes))


def pool_units(job: PoolWork, nodes: int) -> int:
    """What `nodes` of `job` take from their pool: GPUs, or vCPUs for a CPU job."""
    return nodes * (job.gpus_per_node if job.gpu_type_id else job.cpus)


class FairShare:
    """Each organisation's weighted dominant share. `held` is what each (organisation,
    pool) holds, in the pool's units, kept current by the admission pass (it admits and
    preempts); the work ended within the window is read once, when two organisations
    first compete."""

    def __init__(
        self,
        pools: dict[int, NodePool],
        held: dict[tuple[int, int], int],
        weights: dict[int, float],
    ) -> None:
        self.pools, self.held, self.weights = pools, held, weights
        self._recent: dict[tuple[int, int], float] | None = None

    def _read_recent(self) -> dict[tuple[int, int], float]:
        """The average each organisation held of these pools, over the window, in the
        work that ended within it."""
        recent: dict[tuple[int, int], float] = defaultdict(float)
        start = timezone.now() - WINDOW
        ended = (
            Job.objects.filter(finished_at__gt=start, started_at__isnull=False)
            .filter(wanting_pools(list(self.pools)))
            .only(*RECENT_FIELDS)
        )
        for job in ended.iterator(chunk_size=1000):
            assert job.started_at is not None and job.finished_at is not None
            seconds = (job.finished_at - max(job.started_at, start)).total_seconds()
            for pool_id, nodes in job_pool_nodes(job):
                if seconds > 0 and pool_id in self.pools and nodes:
                    average = pool_units(job, nodes) * seconds / WINDOW.total_seconds()
                    recent[(job.tenant_id, pool_id)] += average
        return recent

    def share(self, job: PoolWork) -> float:
        """`job`'s organisation's share of the pools `job` wants, over its weight: the
        largest of them (its dominant one)."""
        if self._recent is None:
            self._recent = self._read_recent()
        dominant = 0.0
        for pool_id, nodes in job_pool_nodes(job):
            pool = self.pools.get(pool_id) if pool_id else None
            if pool is None or not nodes:
                continue
            key = (job.tenant_id, pool.pk)
            capacity = pool.allocatable_gpus if pool.gpu_type_id else pool.allocatable_vcpus
            dominant = max(dominant, (self.held[key] + self._recent[key]) / max(capacity, 1))
        return dominant / self.weights.get(job.tenant_id, 1.0)


RECENT_FIELDS = (
    "tenant_id",
    "gpu_type_id",
    "pool_id",
    "spot_pool_id",
    "on_demand_nodes",
    "spot_nodes",
    "gpus_per_node",
    "cpus",
    "started_at",
    "finished_at",
)


# Each organisation's line of jobs per (on-demand pool, spot pool).
Lines = dict[tuple[int, int | None, int | None], deque[Work]]


def in_fair_order(
    jobs: Iterable[Work], fair: FairShare, lines: Lines[Work] | None = None
) -> Iterator[Work]:
    """`jobs` (of one priority, first come first) in fair order: each organisation's jobs
    for one pool (or on-demand and spot pair) form a line, and the line whose head has
    the lowest share goes next; the caller keeps `fair` current between jobs (what it
    admits). `lines`: filled with what is left, for a caller that stops early."""
    lines = defaultdict(deque) if lines is None else lines
    for job in jobs:
        lines[(job.tenant_id, job.pool_id, job.spot_pool_id)].append(job)

    def entry(key: tuple, head: Work) -> tuple:
        return (fair.share(head), head.created_at, head.pk, key)

    heap = [entry(key, line[0]) for key, line in lines.items()]
    heapq.heapify(heap)
    while heap:
        share, _, _, key = heapq.heappop(heap)
        line = lines[key]
        if fair.share(line[0]) > share:
            # Its organisation took more of the pool since the line was placed.
            heapq.heappush(heap, entry(key, line[0]))
            continue
        job = line.popleft()
        if line:
            heapq.heappush(heap, entry(key, line[0]))
        else:
            del lines[key]
        yield job


def predicted_order(queue: list[Work], fair: FairShare) -> list[Work]:
    """The order admission would take `queue` (priority, then first come, first) in if
    there were room for each job in turn: each one placed adds to its organisation's
    share. What the expected-start estimate (jobs.expectations) simulates."""
    ordered: list[Work] = []
    for priority in PRIORITY_ORDER:
        band = [job for job in queue if job.priority == priority]
        if len({job.tenant_id for job in band}) < 2:
            ordered += band
            continue
        for job in in_fair_order(band, fair):
            ordered.append(job)
            for pool_id, nodes in job_pool_nodes(job):
                if pool_id in fair.pools and nodes:
                    fair.held[(job.tenant_id, pool_id)] += pool_units(job, nodes)
    return ordered


class FairQueue:
    """The queue in admission order: priority, then, among jobs of one priority, the
    next job of the organisation using the least of that job's pools (ties: first come,
    first served). A priority with one organisation queued is read first come, first
    served, in one stream. With several, it is read whole and ordered per pool: each
    organisation's jobs for one pool (or on-demand and spot pair) form a line, and the
    line whose head has the lowest share goes next, so every pool is shared fairly.

    `bands`: the organisations with queued jobs of each priority, read by the pass."""

    def __init__(
        self, queue: QuerySet[Job], bands: dict[str, set[int]], fair: FairShare, chunk: int
    ) -> None:
        self.queue, self.bands, self.fair, self.chunk = queue, bands, fair, chunk
        self._priority = PRIORITY_ORDER[0]
        # The lines of a priority read whole (None: it is read in one stream).
        self._lines: Lines[Job] | None = None

    def __iter__(self) -> Iterator[Job]:
        for priority in PRIORITY_ORDER:
            tenants = self.bands.get(priority)
            if not tenants:
                continue
            self._priority, self._lines = priority, None
            band = self.queue.filter(priority=priority)
            if len(tenants) == 1:
                yield from self._pages(band)
            else:
                yield from self._in_fair_order(band)

    def _pages(self, band: QuerySet[Job]) -> Iterator[Job]:
        """`band` (one priority) first come, first served, in pages from FIRST_PAGE rows
        growing to `chunk`, each read after the last job of the one before."""
        size, last = FIRST_PAGE, None
        while True:
            page = band if last is None else band.filter(after_in_queue(last))
            rows = list(page[:size])
            yield from rows
            if len(rows) < size:
                return
            size, last = min(size * 8, self.chunk), rows[-1]

    def _in_fair_order(self, band: QuerySet[Job]) -> Iterator[Job]:
        self._lines = defaultdict(deque)
        yield from in_fair_order(band.iterator(chunk_size=self.chunk), self.fair, self._lines)

    def after(self, job: Job) -> tuple[list[Job], QuerySet[Job]]:
        """What the iteration hasn't reached when it stops at `job`: the jobs it holds in
        memory, and the query of the others."""
        lower = PRIORITY_ORDER[PRIORITY_ORDER.index(self._priority) + 1 :]
        rest = Q(priority__in=lower)
        if self._lines is None:
            rest |= Q(priority=self._priority) & after_in_queue(job)
        held = [] if self._lines is None else [j for line in self._lines.values() for j in line]
        return held, self.queue.filter(rest)
