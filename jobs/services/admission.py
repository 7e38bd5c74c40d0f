"""Admission: which queued jobs may take compute now (priority, then FIFO, per pool),
against free capacity and each tenant's quota. The only writer of queue waits."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce

from console.compiled import StandIns, compiled, compiled_instances
from console.models import Tenant
from console.queueing import enqueue_on_commit
from console.tenant_admin import suspended_tenant_ids
from jobs.actors import SYSTEM
from jobs.models import HOLDING_COMPUTE, QUOTA_WAITS, Job, JobStatus, WaitKind
from jobs.selectors import (
    before_in_queue,
    job_pool_fields,
    queued_in_order,
    ranked_below,
    wanting_pools,
)
from jobs.services.launch_dispatch import dispatch_launched_on_commit
from jobs.state import job_transition, job_wait_update, jobs_transition_many
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

    def add(self, job: Job) -> None:
        for pool_id, nodes in (
            (job.pool_id, job.on_demand_nodes),
            (job.spot_pool_id, job.spot_nodes),
        ):
            if pool_id:
                self.pool_gpus[pool_id] += nodes * job.gpus_per_node
                self.pool_vcpus[pool_id] += nodes * job.cpus
        self.tenant_gpus[(job.tenant_id, job.gpu_type_id)] += job.total_gpus
        self.tenant_jobs[job.tenant_id] += 1


def held_usage(*, tenant_id: int | None = None, pools: bool = True) -> Usage:
    """Compute held, summed in the database (one row per pool/tenant and GPU type, not per
    job): every pool's (unless not `pools`) and every tenant's, or `tenant_id`'s."""
    usage = Usage()
    for pool_field, nodes_field in (
        (("pool_id", "on_demand_nodes"), ("spot_pool_id", "spot_nodes")) if pools else ()
    ):

        def by_pool(at: StandIns, pool_field=pool_field, nodes_field=nodes_field) -> QuerySet:
            rows = Job.objects.holding_compute().order_by()
            return (
                rows.filter(**{f"{pool_field}__isnull": False})
                .values_list(pool_field)
                .annotate(
                    gpus=Sum(F(nodes_field) * F("gpus_per_node")),
                    vcpus=Sum(F(nodes_field) * F("cpus")),
                )
            )

        for pool_id, gpus, vcpus in compiled(("held-by-pool", pool_field), by_pool).rows():
            usage.pool_gpus[pool_id] += gpus or 0
            usage.pool_vcpus[pool_id] += vcpus or 0

    def by_tenant(at: StandIns) -> QuerySet:
        rows = Job.objects.holding_compute().order_by()
        if tenant_id is not None:
            rows = rows.filter(tenant_id=at.int("tenant"))
        return rows.values_list("tenant_id", "gpu_type_id").annotate(
            gpus=Sum(F("nodes") * F("gpus_per_node")), jobs=Count("pk")
        )

    by_tenant_shape = ("held-by-tenant", tenant_id is None)
    for owner, gpu_type_id, gpus, jobs in compiled(by_tenant_shape, by_tenant).rows(
        tenant=tenant_id
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


def _wait(job: Job, wait: Wait) -> None:
    job_wait_update(job=job, kind=wait.kind, reason=wait.message)


def _admit_launched(job: Job) -> None:
    """Admit the job its launch's transaction has just inserted (no re-read or lock)."""
    job_transition(job=job, to=JobStatus.DISPATCHING, actor=SYSTEM, reason=ADMITTED, fresh=True)
    dispatch_launched_on_commit(job)


def _enqueue_dispatches(jobs: list[Job]) -> None:
    """One job: its own dispatch task. More (a pass that freed capacity for a backlog):
    batches of DISPATCH_BATCH_SIZE, each dispatched together (`jobs_dispatch`)."""
    if len(jobs) == 1:
        enqueue_on_commit("jobs.tasks.job_dispatch_task", jobs[0].pk)
        return
    size = settings.DISPATCH_BATCH_SIZE
    for start in range(0, len(jobs), size):
        batch = [job.pk for job in jobs[start : start + size]]
        enqueue_on_commit("jobs.tasks.jobs_dispatch_task", batch)


def locked_admission_state(
    *, tenant_id: int | None = None
) -> tuple[dict[int, NodePool], dict[int, list[TenantQuota]]]:
    """The active pools, locked in pk order (the lock order every admission takes, so
    admissions of a pool serialise), and the quotas (of one tenant, or all)."""
    pools = {
        p.pk: p for p in NodePool.objects.select_for_update().filter(is_active=True).order_by("pk")
    }
    quotas: dict[int, list[TenantQuota]] = defaultdict(list)
    rows = (
        TenantQuota.objects.all()
        if tenant_id is None
        else TenantQuota.objects.filter(tenant_id=tenant_id)
    )
    for quota in rows:
        quotas[quota.tenant_id].append(quota)
    return pools, quotas


def _admission_view(job: Job) -> dict[str, int]:
    """What a launch's admission reads once its pools are locked, in one indexed query
    (each was a statement of its own, while the pool locks were held): the other queued
    jobs that want `job`'s pools (ahead of it by what holds them, behind it, and all),
    whether its tenant is suspended now, and the GPUs and vCPUs its pools hold
    (`<field>_gpus`, `<field>_vcpus`). Compiled once per shape."""
    pool_ids = job_pool_fields(job)

    def build(at: StandIns) -> QuerySet:
        like = Job(
            pk=at.int("pk"),
            tenant_id=at.int("tenant"),
            priority=job.priority,
            created_at=at.datetime("created_at"),
            **{name: at.int(name) for name in pool_ids},
        )
        pools = [getattr(like, name) for name in pool_ids]
        mine, quota_wait = Q(tenant_id=like.tenant_id), Q(wait_kind__in=OWN_TENANT_WAITS)
        queued = Q(status=JobStatus.QUEUED) & wanting_pools(pools) & ~Q(pk=like.pk)
        ahead = queued & before_in_queue(like)
        holding = Q(status__in=HOLDING_COMPUTE)
        held = {}
        for name, pool_id in zip(pool_ids, pools, strict=True):
            # A pool's usage, as held_usage sums it: its on-demand and its spot nodes.
            on_demand, spot = holding & Q(pool_id=pool_id), holding & Q(spot_pool_id=pool_id)
            for unit, per_node in (("gpus", "gpus_per_node"), ("vcpus", "cpus")):
                held[f"{name}_{unit}"] = Coalesce(
                    Sum(F("on_demand_nodes") * F(per_node), filter=on_demand), 0
                ) + Coalesce(Sum(F("spot_nodes") * F(per_node), filter=spot), 0)
        return (
            Job.objects.filter(queued | (holding & wanting_pools(pools)) | Q(pk=like.pk))
            .order_by()
            .values(one=Value(1))  # constant: no GROUP BY, one row
            .annotate(
                others_capacity=Count("pk", filter=ahead & ~mine & ~quota_wait),
                own_capacity=Count("pk", filter=ahead & mine & ~quota_wait),
                own_quota=Count("pk", filter=ahead & mine & quota_wait),
                # Behind it by priority. A job of its own priority queued after it is a
                # launch that committed first while this one waited for the lock: it was
                # decided without seeing this job, and a full pass for it would only
                # relabel its wait (from capacity to "behind earlier jobs"), at the cost
                # of reading the whole queue on every concurrent launch into a full pool.
                behind=Count("pk", filter=queued & ranked_below(like)),
                all=Count("pk", filter=queued),
                # Read after the locks, so a suspension committed meanwhile is seen.
                suspended=Count("pk", filter=Q(pk=like.pk, tenant__suspended_at__isnull=False)),
                **held,
            )
        )

    shape = ("admission-view", job.priority, tuple(pool_ids))
    row = compiled(shape, build).first(
        pk=job.pk, tenant=job.tenant_id, created_at=job.created_at, **pool_ids
    )
    assert row is not None  # the job itself is a row of it
    return row


def _locked_pools(pool_ids: list[int]) -> list[NodePool]:
    """The active pools of `pool_ids`, row-locked in pk order (compiled once per count)."""

    def build(at: StandIns) -> QuerySet[NodePool]:
        wanted = [at.int(f"pool{n}") for n in range(len(pool_ids))]
        return NodePool.objects.select_for_update().filter(pk__in=wanted, is_active=True)

    return compiled_instances(
        ("admission-pools", len(pool_ids)),
        NodePool,
        lambda at: build(at).order_by("pk"),
        **{f"pool{n}": pool_id for n, pool_id in enumerate(pool_ids)},
    )


def job_admit_submitted(*, job: Job, tenant_has_quotas: bool = True) -> bool:
    """Admission of one just-queued job, at a cost independent of the queue's length.

    It keeps `jobs_admit`'s order: if a job ranked before it (higher priority, or same
    priority and earlier) waits for one of its pools, it waits too (no overtaking), unless
    that job is held only by another tenant's quota; otherwise it is checked against the
    free capacity and its tenant's quota. The queue isn't re-examined: nothing freed
    compute since the last full pass (`jobs_admit` runs whenever a job ends, pauses or is
    cancelled, and in the reconciler), so every job already queued still doesn't fit.
    Returns whether it was admitted; its wait says why not. When it goes before jobs
    already waiting for its pools, a full pass follows.

    `tenant_has_quotas=False` (the launch's validation just found none) skips locking
    and reading quota rows: locking none serialises nothing anyway, and a quota created
    in the milliseconds since then applies from the next launch on.
    """
    pool_ids = sorted(pid for pid in (job.pool_id, job.spot_pool_id) if pid)
    # Part of the launch's transaction (job_submit): no savepoint of its own, as a
    # failure here rolls the whole launch back anyway.
    with transaction.atomic(savepoint=False):
        # The same row locks as jobs_admit (pools, in pk order) serialise admissions of a
        # pool; the tenant's quota rows serialise its admissions across pools.
        pools = {pool.pk: pool for pool in _locked_pools(pool_ids)}
        quotas: dict[int, list[TenantQuota]] = defaultdict(list)
        if tenant_has_quotas:
            for quota in compiled_instances(
                "admission-quotas",
                TenantQuota,
                lambda at: (
                    TenantQuota.objects.for_tenant(Tenant(pk=at.int("tenant")))
                    .select_for_update()
                    .order_by("pk")
                ),
                tenant=job.tenant_id,
            ):
                quotas[quota.tenant_id].append(quota)
        view = _admission_view(job)
        if view["suspended"]:  # suspended since its launch check
            _wait(job, SUSPENDED)
            return False
        # Another tenant's job held only by its quota blocks nobody else (as in jobs_admit).
        wait: Wait | None
        if view["others_capacity"] or view["own_capacity"]:
            wait = BEHIND_IN_POOL
        elif view["own_quota"]:
            wait = BEHIND_OWN_QUOTA
        else:
            # A tenant without quotas needs no usage of its own (blocking_wait reads none).
            usage = (
                held_usage(tenant_id=job.tenant_id, pools=False)
                if quotas[job.tenant_id]
                else Usage()
            )
            for name, pool_id in job_pool_fields(job).items():
                usage.pool_gpus[pool_id] = view[f"{name}_gpus"]
                usage.pool_vcpus[pool_id] = view[f"{name}_vcpus"]
            wait = blocking_wait(job, pools, usage, quotas)
        if wait:
            _wait(job, wait)
        else:
            _admit_launched(job)
        if view["behind"] if wait else view["all"]:
            # It went past waiting jobs (a higher priority, or another tenant's quota
            # wait): that can change what holds them back, so a full pass re-sorts them.
            # A launch into a pool where it is last, the common case, skips this.
            jobs_admit()
            job.refresh_from_db()
        return job.status == JobStatus.DISPATCHING


@transaction.atomic
def jobs_admit() -> list[Job]:
    """Admit queued jobs in priority, then FIFO, order while they fit.

    A job that doesn't fit its pool blocks later jobs for that pool (no overtaking);
    a job held back by its tenant's quota blocks only that tenant's later jobs there.
    """
    pools, quotas = locked_admission_state()
    usage = held_usage()
    blocked_pools: set[int] = set()
    # (tenant, pool) pairs held back by the tenant's quota: its later jobs there wait too.
    blocked_by_quota: set[tuple[int, int]] = set()
    suspended = suspended_tenant_ids()
    admitted = []
    for job in queued_in_order().select_for_update():
        job_pools = {pid for pid in (job.pool_id, job.spot_pool_id) if pid}
        wait: Wait | None
        if job.tenant_id in suspended:
            _wait(job, SUSPENDED)  # holds back no one: its organisation's jobs all wait
            continue
        if job_pools & blocked_pools:
            wait = BEHIND_IN_POOL
        elif {(job.tenant_id, pid) for pid in job_pools} & blocked_by_quota:
            wait = BEHIND_OWN_QUOTA
        else:
            wait = blocking_wait(job, pools, usage, quotas)
        if wait:
            if wait.kind == WaitKind.QUOTA:
                blocked_by_quota |= {(job.tenant_id, pid) for pid in job_pools}
            elif wait.kind != WaitKind.QUOTA_QUEUE:
                blocked_pools |= job_pools
            _wait(job, wait)
            continue
        usage.add(job)
        admitted.append(job)
    # A pass that frees capacity for a backlog admits it in a few statements, not a
    # transition each (10,000 jobs: seconds instead of minutes).
    for start in range(0, len(admitted), ADMIT_CHUNK):
        jobs_transition_many(
            jobs=admitted[start : start + ADMIT_CHUNK],
            to=JobStatus.DISPATCHING,
            actor=SYSTEM,
            reason=ADMITTED,
            expected_from=frozenset({JobStatus.QUEUED}),
        )
    _enqueue_dispatches(admitted)
    return admitted
