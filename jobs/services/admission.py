"""Admission: which queued jobs may take compute now (priority, then FIFO, per pool),
against free capacity and each tenant's quota, preempting lower-priority jobs where the
rules allow (jobs.services.preemption). The only writer of queue waits."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)

from jobs.actors import SYSTEM
from jobs.models import QUOTA_WAITS, Job, JobStatus, WaitKind
from jobs.selectors import before_in_queue, queued_in_order, queued_in_pools, wanting_pools
from jobs.services.dispatch import dispatch_on_commit
from jobs.services.fair_share import FairQueue, FairShare, job_pool_nodes, pool_units
from jobs.services.preemption import jobs_preempt, preemption_plan
from jobs.services.topology import Blocks, needs_block
from jobs.state import job_transition_held, job_wait_update, jobs_transition_many
from marketplace.models import NodePool, TenantQuota

ADMITTED = "admitted"
# Rows per statement when a pass admits many (SQLite caps a statement's parameters).
ADMIT_CHUNK = 1000


@dataclass
class Usage:
    """Compute held per pool and per tenant, as admission counts it."""

    pool_gpus: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    pool_vcpus: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    tenant_gpus: dict[tuple[int, int | None], int] = field(default_factory=lambda: defaultdict(int))
    tenant_jobs: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    # GPUs (vCPUs in a CPU pool) each (tenant, pool) holds: fair share's measure.
    tenant_pool: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))

    def add(self, job: Job, sign: int = 1) -> None:
        for pool_id, nodes in job_pool_nodes(job):
            if pool_id:
                self.pool_gpus[pool_id] += sign * nodes * job.gpus_per_node
                self.pool_vcpus[pool_id] += sign * nodes * job.cpus
                self.tenant_pool[(job.tenant_id, pool_id)] += sign * pool_units(job, nodes)
        self.tenant_gpus[(job.tenant_id, job.gpu_type_id)] += sign * job.total_gpus
        self.tenant_jobs[job.tenant_id] += sign

    def remove(self, job: Job) -> None:
        """What `add` counted for `job`, no longer held (a preemption victim)."""
        self.add(job, sign=-1)


def held_usage(
    *, pool_ids: Collection[int] | None = None, tenant_ids: Collection[int] | None = None
) -> Usage:
    """Compute held, summed in the database (one row per pool/tenant and GPU type, not per
    job): of the pools `pool_ids` and the tenants `tenant_ids` (None: all of them)."""
    usage = Usage()
    holding = Job.objects.holding_compute().order_by()
    # One read for both pool fields: a row per (on-demand pool, spot pool) pair held.
    rows = holding if pool_ids is None else holding.filter(wanting_pools(list(pool_ids)))
    sums = {
        f"{kind}_{unit}": Sum(F(nodes) * F(per_node))
        for kind, nodes in (("on_demand", "on_demand_nodes"), ("spot", "spot_nodes"))
        for unit, per_node in (("gpus", "gpus_per_node"), ("vcpus", "cpus"))
    }
    rows = rows.values_list("tenant_id", "pool_id", "spot_pool_id", "gpu_type_id")
    for owner, pool_id, spot_pool_id, gpu_type_id, *held in rows.annotate(**sums):
        for pid, gpus, vcpus in ((pool_id, *held[:2]), (spot_pool_id, *held[2:])):
            if pid and (pool_ids is None or pid in pool_ids):
                usage.pool_gpus[pid] += gpus or 0
                usage.pool_vcpus[pid] += vcpus or 0
                usage.tenant_pool[(owner, pid)] += (gpus if gpu_type_id else vcpus) or 0
    if tenant_ids is not None and not tenant_ids:
        return usage
    rows = holding if tenant_ids is None else holding.filter(tenant_id__in=list(tenant_ids))
    for owner, gpu_type_id, gpus, jobs in rows.values_list("tenant_id", "gpu_type_id").annotate(
        gpus=Sum(F("nodes") * F("gpus_per_node")), jobs=Count("pk")
    ):
        usage.tenant_gpus[(owner, gpu_type_id)] += gpus or 0
        usage.tenant_jobs[owner] += jobs
    return usage


@dataclass(frozen=True)
class Wait:
    """Why a queued job can't be admitted now: the kind decides, the message is shown."""

    kind: str
    message: str


BEHIND_IN_POOL = Wait(WaitKind.POOL_QUEUE, "waiting behind earlier jobs for the same pool")
BEHIND_OWN_QUOTA = Wait(
    WaitKind.QUOTA_QUEUE, "waiting behind your organisation's earlier jobs (quota)"
)
SUSPENDED = Wait(WaitKind.SUSPENDED, "your organisation is suspended")
FAIR_SHARE_TURN = Wait(
    WaitKind.FAIR_SHARE,
    "fair share: organisations using less of the pool go first among equal priorities",
)
# Waits that hold back only the job's own organisation, never another's jobs.
OWN_TENANT_WAITS = QUOTA_WAITS | {WaitKind.SUSPENDED}


def _free(pool: NodePool, used_gpus: int, used_vcpus: int) -> int:
    if pool.gpu_type_id:
        return pool.allocatable_gpus - used_gpus
    return pool.allocatable_vcpus - used_vcpus


def blocking_wait(
    job: Job, pools: dict[int, NodePool], usage: Usage, quotas: dict[int, list[TenantQuota]]
) -> Wait | None:
    """What keeps `job` from fitting now (its pools' free capacity, then its tenant's
    quota), or None when it fits."""
    for pool_id, nodes in ((job.pool_id, job.on_demand_nodes), (job.spot_pool_id, job.spot_nodes)):
        if not pool_id:
            continue
        pool = pools.get(pool_id)
        if pool is None:
            return Wait(WaitKind.CAPACITY, "its pool is no longer active")
        refusal = pool.gpu_memory_refusal(job.gpu_memory_gib)
        if refusal:  # staff raised the pool's margin since the launch
            return Wait(WaitKind.CAPACITY, refusal)
        need = nodes * (job.gpus_per_node if pool.gpu_type_id else job.cpus)
        free = _free(pool, usage.pool_gpus[pool_id], usage.pool_vcpus[pool_id])
        if need > free:
            unit = "GPUs" if pool.gpu_type_id else "vCPUs"
            return Wait(
                WaitKind.CAPACITY, f"waiting for {need} {unit} in {pool.name} ({max(free, 0)} free)"
            )
    for quota in quotas.get(job.tenant_id, []):
        if (
            quota.gpu_type_id is None
            and quota.max_concurrent_jobs is not None
            and usage.tenant_jobs[job.tenant_id] >= quota.max_concurrent_jobs
        ):
            return Wait(WaitKind.QUOTA, f"quota: at most {quota.max_concurrent_jobs} jobs at once")
        if quota.max_gpus is None or not job.gpu_type_id:
            continue
        if quota.gpu_type_id == job.gpu_type_id:
            held = usage.tenant_gpus[(job.tenant_id, job.gpu_type_id)]
        elif quota.gpu_type_id is None:
            held = sum(v for (t, _), v in usage.tenant_gpus.items() if t == job.tenant_id)
        else:
            continue
        if held + job.total_gpus > quota.max_gpus:
            return Wait(WaitKind.QUOTA, f"quota: {held} of {quota.max_gpus} GPUs in use")
    return None


def _block(blocked: dict[int, Job], job: Job) -> None:
    """`job` holds back its pools (those no earlier job held back already)."""
    for pool_id in job_pools(job):
        blocked.setdefault(pool_id, job)


def _behind(job: Job, blocked: dict[int, Job]) -> Wait:
    """Why `job` waits for pools held back (`blocked`: by which job): behind earlier
    jobs, or by fair share's order, when a later job of another organisation went first."""
    for blocker in (blocked[pool_id] for pool_id in job_pools(job) if pool_id in blocked):
        if (
            blocker.tenant_id != job.tenant_id
            and blocker.priority == job.priority
            and (blocker.created_at, blocker.pk) > (job.created_at, job.pk)
        ):
            return FAIR_SHARE_TURN
    return BEHIND_IN_POOL


def _admit_by_preemption(
    job: Job, pools: dict[int, NodePool], usage: Usage, quotas: dict[int, list[TenantQuota]]
) -> set[int] | None:
    """Make room for `job`, which doesn't fit its pools, by preempting lower-priority
        jobs (jobs.services.preemption's rules), all or nothing: only when the victims
        free enough in every pool it lacks room in and its quota then lets it run. `usage`
        loses what the victims held. Returns the victims' ids when `job` may be admitted
    now, None when it must wait."""
    deficits: dict[int, int] = {}
    held: dict[int, int] = {}
    for pool_id, nodes in ((job.pool_id, job.on_demand_nodes), (job.spot_pool_id, job.spot_nodes)):
        if not pool_id:
            continue
        pool = pools.get(pool_id)
        if pool is None:
            return None
        need = nodes * (job.gpus_per_node if pool.gpu_type_id else job.cpus)
        free = _free(pool, usage.pool_gpus[pool_id], usage.pool_vcpus[pool_id])
        held[pool_id] = usage.pool_gpus[pool_id] if pool.gpu_type_id else usage.pool_vcpus[pool_id]
        if need > free:
            deficits[pool_id] = need - free
    plan = preemption_plan(job, pools, deficits, held) if deficits else None
    if not plan:
        return None
    for victim in plan:
        usage.remove(victim.job)
    if blocking_wait(job, pools, usage, quotas) is not None:
        for victim in plan:  # its quota holds it back anyway: stop no one
            usage.add(victim.job)
        return None
    jobs_preempt(preemptor=job, victims=plan, pools=pools)
    return {victim.job.pk for victim in plan}


def _wait(job: Job, wait: Wait) -> None:
    job_wait_update(job=job, kind=wait.kind, reason=wait.message)


def job_pools(job: Job) -> list[int]:
    """The pools a job takes compute from (on demand, spot): what admission passes for it
    look at."""
    return [pool_id for pool_id in (job.pool_id, job.spot_pool_id) if pool_id]


def _locked_pools(pool_ids: Collection[int] | None) -> dict[int, NodePool]:
    """The active pools (of `pool_ids`, or all), locked in pk order: the first locks of
    every admission, so two passes over a pool serialise."""
    pools = NodePool.objects.select_for_update().filter(is_active=True).order_by("pk")
    if pool_ids is not None:
        pools = pools.filter(pk__in=list(pool_ids))
    return {pool.pk: pool for pool in pools}


def _locked_quotas(tenant_ids: Collection[int]) -> dict[int, list[TenantQuota]]:
    """The quotas of `tenant_ids`, locked in pk order after the pools: two admissions of
    one tenant's jobs on different pools serialise on them."""
    quotas: dict[int, list[TenantQuota]] = defaultdict(list)
    if not tenant_ids:  # nothing to lock (a tenant without quotas): no query
        return quotas
    rows = TenantQuota.objects.select_for_update().filter(tenant_id__in=list(tenant_ids))
    for quota in rows.order_by("pk"):
        quotas[quota.tenant_id].append(quota)
    return quotas


def locked_admission_state(job: Job) -> tuple[dict[int, NodePool], dict[int, list[TenantQuota]]]:
    """What admission locks and reads to judge `job` alone (a resume): its pools and its
    tenant's quotas, in admission's lock order."""
    return _locked_pools(job_pools(job)), _locked_quotas([job.tenant_id])


def _pools_reached(pool_ids: Collection[int]) -> set[int]:
    """`pool_ids` and every pool a queued job wants together with one of them (on demand
    beside spot), transitively: what one pass must look at so that no job of the pass
    is judged on a pool it didn't lock. Usually one query that finds nothing new."""
    reached, frontier = set(pool_ids), set(pool_ids)
    while frontier:
        pairs = queued_in_pools(list(frontier)).order_by().values_list("pool_id", "spot_pool_id")
        frontier = {pool_id for pair in pairs.distinct() for pool_id in pair if pool_id} - reached
        reached |= frontier
    return reached


@dataclass
class QueuedTenants:
    """The tenants of a queue as a pass reads them once, after its pool locks (a
    suspension locks only its tenant's row: read then, it is seen)."""

    ids: set[int] = field(default_factory=set)
    with_quotas: set[int] = field(default_factory=set)  # whose quotas the pass locks
    suspended: set[int] = field(default_factory=set)
    weights: dict[int, float] = field(default_factory=dict)  # fair share
    by_priority: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))


def _queued_tenants(queue: QuerySet[Job]) -> QueuedTenants:
    """The tenants of `queue` and what a pass needs of them, in one read: a pass of
    tenants without quotas reads no quota row."""
    has_quotas = Exists(TenantQuota.objects.filter(tenant_id=OuterRef("tenant_id")))
    rows = (
        queue.order_by()
        .values_list("tenant_id", "priority", "tenant__suspended_at", "tenant__fair_share_weight")
        .annotate(has_quotas=has_quotas)
        .distinct()
    )
    tenants = QueuedTenants()
    for tenant_id, priority, suspended_at, weight, tenant_has_quotas in rows:
        tenants.ids.add(tenant_id)
        tenants.by_priority[priority].add(tenant_id)
        tenants.weights[tenant_id] = float(weight)
        if tenant_has_quotas:
            tenants.with_quotas.add(tenant_id)
        if suspended_at is not None:
            tenants.suspended.add(tenant_id)
    return tenants


def _hold_rest(rest: QuerySet[Job], blocked: dict[int, Job]) -> None:
    """The queue after the point where every pool of the pass is blocked (`blocked`:
    by which job): each job waits behind earlier ones, by fair share (see `_behind`) or
    for its organisation's suspension, as the loop would have said. One read, of only
    those whose wait changes (none, when the labels are current)."""
    passed_over = Q(pk__in=[])
    for blocker in set(blocked.values()):
        pools = [pool_id for pool_id, job in blocked.items() if job is blocker]
        passed_over |= (
            wanting_pools(pools)
            & Q(priority=blocker.priority)
            & ~Q(tenant_id=blocker.tenant_id)
            & before_in_queue(blocker)
        )
    waits = (SUSPENDED, FAIR_SHARE_TURN, BEHIND_IN_POOL)  # in the order the loop decides
    due = Case(
        When(tenant__suspended_at__isnull=False, then=Value(0)),
        When(passed_over, then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    stale = Q(pk__in=[])
    for number, wait in enumerate(waits):
        stale |= Q(due=number) & ~Q(wait_kind=wait.kind, status_reason=wait.message)
    for job in rest.annotate(due=due).filter(stale):
        _wait(job, waits[job.due])


def jobs_admit(*, pools: Collection[int] | None = None, launched: Job | None = None) -> list[Job]:
    """Admit queued jobs in priority order, and among equal priorities by fair share
    (jobs.services.fair_share: the organisation with the lowest weighted share first,
    then FIFO), while they fit: of the queues of `pools` (those a launch, a cancel, an
    ending job or a capacity change touched), or of every pool. The only admission;
    returns the jobs it admitted.

    A job that doesn't fit its pool blocks later jobs for that pool (no overtaking); a job
    held back by its tenant's quota blocks only that tenant's later jobs there; a
    suspended organisation's jobs wait without blocking anyone. Once every pool of the
    pass is blocked the rest of the queue can't move, so the pass stops there: a launch
    into a full pool costs a few rows, not the whole queue.

    `launched`: the job its launch's transaction has just inserted (part of that
    transaction, and of `pools`); it is changed in place.
    """
    with transaction.atomic(savepoint=False):
        reach = None if pools is None else _pools_reached(pools)
        locked_pools = _locked_pools(reach)
        queue = queued_in_order()
        if reach is not None:
            queue = queue.filter(wanting_pools(list(reach)))
        # Jobs queued into these pools from now on wait for the pool locks to commit.
        tenants = _queued_tenants(queue)
        suspended = tenants.suspended
        quotas = _locked_quotas(tenants.with_quotas)
        usage = held_usage(pool_ids=reach, tenant_ids=list(quotas))
        fair = FairShare(locked_pools, usage.tenant_pool, tenants.weights)
        in_order = FairQueue(queue, tenants.by_priority, fair, chunk=ADMIT_CHUNK)
        every_pool = set(locked_pools) if reach is None else reach
        blocks = Blocks(locked_pools)
        blocked: dict[int, Job] = {}  # pool → the first job that blocked it
        # (tenant, pool) pairs held back by the tenant's quota: its later jobs there wait too.
        blocked_by_quota: set[tuple[int, int]] = set()
        admitted: list[Job] = []
        preempted: set[int] = set()
        launched_waits = launched is not None
        for job in in_order:
            if launched is not None and job.pk == launched.pk:
                job, launched_waits = launched, False
            wanted = set(job_pools(job))
            wait: Wait | None
            if job.pk in preempted:
                # Requeued by this pass for a higher-priority job: judged by the next one,
                # and nothing later for its pools overtakes it meanwhile.
                _block(blocked, job)
                continue
            if job.tenant_id not in tenants.ids:
                # Queued without the pool locks (a requeue) after the tenants were read:
                # its quotas weren't, so it is judged by its own pass; nothing overtakes it.
                _block(blocked, job)
                continue
            if job.tenant_id in suspended:
                _wait(job, SUSPENDED)  # holds back no one: its organisation's jobs all wait
                continue
            if wanted & blocked.keys():
                wait = _behind(job, blocked)
            elif {(job.tenant_id, pid) for pid in wanted} & blocked_by_quota:
                wait = BEHIND_OWN_QUOTA
            else:
                wait = blocking_wait(job, locked_pools, usage, quotas)
                # A gang placed in one block doesn't preempt: victims elsewhere in the
                # pool wouldn't free its block.
                if wait is not None and wait.kind == WaitKind.CAPACITY and not needs_block(job):
                    victims = _admit_by_preemption(job, locked_pools, usage, quotas)
                    if victims is not None:
                        wait = None
                        preempted |= victims
                if wait is None and (why := blocks.place(job)):
                    wait = Wait(WaitKind.TOPOLOGY, why)
            if wait is None:
                usage.add(job)
                admitted.append(job)
                continue
            if wait.kind == WaitKind.QUOTA:
                blocked_by_quota |= {(job.tenant_id, pid) for pid in wanted}
            elif wait.kind != WaitKind.QUOTA_QUEUE:
                _block(blocked, job)
            _wait(job, wait)
            if every_pool <= blocked.keys():
                pending, rest = in_order.after(job)
                for later in pending:  # read already: labelled as the loop would
                    if launched is not None and later.pk == launched.pk:
                        continue  # labelled below, on the caller's instance
                    suspended_later = later.tenant_id in suspended
                    wait = SUSPENDED if suspended_later else _behind(later, blocked)
                    if (later.wait_kind, later.status_reason) != (wait.kind, wait.message):
                        _wait(later, wait)
                # A launch that comes after every pool's blocker changes no one else's
                # wait (the blockers are those the last pass saw): only it is labelled,
                # and the rest of the queue isn't read under the pool locks.
                if not launched_waits:
                    _hold_rest(rest, blocked)
                break
        if launched is not None and launched_waits:
            # The pass stopped before it: its pools are all held by earlier jobs.
            suspended_launch = launched.tenant_id in suspended
            _wait(launched, SUSPENDED if suspended_launch else _behind(launched, blocked))
        # The launch's own row is this transaction's and current: moved without a re-read.
        others = [job for job in admitted if job is not launched]
        if launched is not None and len(others) < len(admitted):
            job_transition_held(
                job=launched, to=JobStatus.DISPATCHING, actor=SYSTEM, reason=ADMITTED
            )
        # A pass that frees capacity for a backlog admits it in a few statements, not a
        # transition each (10,000 jobs: seconds instead of minutes).
        for start in range(0, len(others), ADMIT_CHUNK):
            jobs_transition_many(
                jobs=others[start : start + ADMIT_CHUNK],
                to=JobStatus.DISPATCHING,
                actor=SYSTEM,
                reason=ADMITTED,
                expected_from=frozenset({JobStatus.QUEUED}),
            )
        if admitted:
            dispatch_on_commit()
    return admitted
