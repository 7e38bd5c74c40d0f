"""Reads for jobs; every tenant read goes through `for_tenant`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from datetime import datetime
from decimal import Decimal

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Case, F, IntegerField, Q, QuerySet, Value, When

from console.host_access import HostIsolation
from console.permissions import Capability, has_capability
from jobs.backends import configured_backends, get_backend
from jobs.checkpoints.store import Checkpoint, checkpoint_store, job_prefix
from jobs.models import Job, JobEvent, JobResume, JobStatus, Priority

log = logging.getLogger(__name__)


def jobs_for_list_page(*, tenant, status: str | None = None, query: str = "") -> QuerySet[Job]:
    """The tenant's jobs the jobs page lists, filtered: what its pages count. Read a
    page's rows with `list_page_rows`."""
    jobs = Job.objects.for_tenant(tenant)
    if status:
        jobs = jobs.filter(status=status)
    if query:
        jobs = jobs.filter(name__icontains=query)
    return jobs


# What a row of the jobs page shows.
LIST_PAGE_COLUMNS = (
    "id", "name", "project", "status", "status_reason", "gpu_type_id", "gpus_per_node",
    "cpus", "nodes", "created_at", "started_at", "status_changed_at", "run_seconds",
    "running_since",
)  # fmt: skip
# Whether a job's pools are the sandbox's simulated ones, read with a list's rows
# (`Job.simulated` reads these when present): no pool object per row.
SIMULATED_POOLS = {
    "pool_simulated": F("pool__simulated"),
    "spot_pool_simulated": F("spot_pool__simulated"),
}


def list_page_rows(jobs: QuerySet[Job], *, also: tuple[str, ...] = ()) -> QuerySet[Job, dict]:
    """The jobs page's rows as values (no model instance, no catalog object per row),
    with the `also` columns (what its costs read). Their GPU types' and regions' names
    are the catalog's (`catalog_names`), not joined in."""
    return jobs.annotate(**SIMULATED_POOLS).values(
        *dict.fromkeys((*LIST_PAGE_COLUMNS, "region_id", *also)), *SIMULATED_POOLS
    )


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
    return JobEvent.objects.filter(job=job).select_related("actor_user").order_by("at", "pk")


PRIORITY_ORDER = (Priority.CRITICAL, Priority.NORMAL, Priority.LOW)


def queued_in_order() -> QuerySet[Job]:
    """Every queued job in admission order: priority, then first come, first served."""
    rank = Case(
        *[When(priority=p, then=Value(r)) for r, p in enumerate(PRIORITY_ORDER)],
        output_field=IntegerField(),
    )
    return (
        Job.objects.filter(status=JobStatus.QUEUED)
        .annotate(priority_rank=rank)
        .order_by("priority_rank", "created_at", "pk")
    )


def job_pool_fields(job: Job) -> dict[str, int]:
    """The job's pools by the field that names them (its on-demand and its spot pool)."""
    return {name: getattr(job, name) for name in ("pool_id", "spot_pool_id") if getattr(job, name)}


def wanting_pools(pool_ids: list[int]) -> Q:
    """Jobs that want (or hold) one of the pools, on demand or on spot."""
    return Q(pool_id__in=pool_ids) | Q(spot_pool_id__in=pool_ids)


@dataclass(frozen=True, slots=True)
class QueuedWork:
    """A job waiting for or holding a pool, as the expected-start estimate reads it: plain
    values, not a model instance, since it reads the whole queue ahead of a job (a
    launch's answer says when it starts) and an instance per row cost three times the
    row's own read."""

    pk: int
    tenant_id: int
    status: str
    priority: str
    project: str
    launch_template_id: int | None
    image_id: int
    gpu_type_id: int | None
    max_runtime_minutes: int
    pool_id: int | None
    spot_pool_id: int | None
    on_demand_nodes: int
    spot_nodes: int
    gpus_per_node: int
    cpus: int
    nodes: int
    run_seconds: float
    running_since: datetime | None
    status_changed_at: datetime
    created_at: datetime
    # Its organisation's (`Tenant.fair_share_weight`): what fair share divides by.
    fair_share_weight: Decimal

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def queued_work(jobs: QuerySet[Job]) -> list[QueuedWork]:
    """`jobs` read as `QueuedWork` rows, in the queryset's order."""
    columns = [field.name for field in fields(QueuedWork) if field.name != "fair_share_weight"]
    return [QueuedWork(*row) for row in jobs.values_list(*columns, "tenant__fair_share_weight")]


def queued_in_pools(pool_ids: list[int]) -> QuerySet[Job]:
    return Job.objects.filter(status=JobStatus.QUEUED).filter(wanting_pools(pool_ids))


def before_in_queue(job: Job) -> Q:
    """The jobs before `job` in admission order (priority, then FIFO); the others
    (but `job`) come after it."""
    rank = PRIORITY_ORDER.index(job.priority)
    return Q(priority__in=PRIORITY_ORDER[:rank]) | Q(
        Q(created_at__lt=job.created_at) | Q(created_at=job.created_at, pk__lt=job.pk),
        priority=job.priority,
    )


def after_in_queue(job: Job) -> Q:
    """The jobs after `job` in admission order (priority, then FIFO)."""
    return ~before_in_queue(job) & ~Q(pk=job.pk)


def ranked_below(job: Job) -> Q:
    """The jobs of a lower priority than `job`'s (none below the lowest)."""
    lower = PRIORITY_ORDER[PRIORITY_ORDER.index(job.priority) + 1 :]
    return Q(priority__in=lower) if lower else Q(pk__in=[])


def queued_with(job: Job) -> QuerySet[Job]:
    """The other queued jobs that want one of `job`'s pools; an indexed filter, so its
    cost doesn't grow with the rest of the queue."""
    pools = [pid for pid in (job.pool_id, job.spot_pool_id) if pid]
    return queued_in_pools(pools).exclude(pk=job.pk)


def queued_ahead_of(job: Job) -> QuerySet[Job]:
    """Queued jobs before `job` in admission order that want one of its pools."""
    return queued_with(job).filter(before_in_queue(job))


def job_from_row(row: dict) -> Job:
    """A job from a list page's `values()` row (its model columns; the rest deferred),
    as the database would have built it, plus the row's other keys as attributes."""
    # from_db wants the values in the model's field order.
    columns = [name for name in _JOB_COLUMNS if name in row]
    job = Job.from_db(DEFAULT_DB_ALIAS, columns, [row[name] for name in columns])
    for name in row.keys() - set(columns):
        setattr(job, name, row[name])
    return job


_JOB_COLUMNS = tuple(field.attname for field in Job._meta.concrete_fields)


def queue_positions(jobs: list[Job]) -> dict[int, int]:
    """1-based queue position of each queued job among the jobs waiting for its pools
    (its own pools, not the whole platform's queue)."""
    wanted = [j for j in jobs if j.status == JobStatus.QUEUED]
    if not wanted:
        return {}
    if len(wanted) == 1:  # a job page or an API answer: one indexed count
        return {wanted[0].pk: 1 + queued_ahead_of(wanted[0]).count()}
    wanted_ids = {j.pk for j in wanted}
    # A list: one pass over the queue beats a count per row.
    order = [
        (pk, {p for p in pools if p})
        for pk, *pools in queued_in_order().values_list("pk", "pool_id", "spot_pool_id")
    ]
    positions = {}
    for index, (pk, pools) in enumerate(order):
        if pk in wanted_ids:
            positions[pk] = 1 + sum(1 for _, other in order[:index] if other & pools)
    return positions


def queue_position(job: Job) -> int | None:
    return queue_positions([job]).get(job.pk)


DASHBOARD_JOBS = 8


def dashboard_jobs_context(request) -> dict:
    """The dashboard's job section: the latest jobs and how many run (registered with
    console.dashboard by JobsConfig)."""
    if not has_capability(request.membership, Capability.VIEW_TENANT):
        return {"recent_jobs": [], "running_count": 0}
    jobs = jobs_for_tenant(tenant=request.tenant)
    return {
        "recent_jobs": list(jobs[:DASHBOARD_JOBS]),
        "running_count": jobs.filter(status=JobStatus.RUNNING).count(),
    }


def host_jobs_isolation() -> HostIsolation | None:
    """What the backends running jobs on the console's host say of their isolation
    (registered with console.host_access); None when none is configured."""
    answers = [
        backend.tenant_isolation()
        for backend in configured_backends()
        if backend.runs_on_console_host
    ]
    if not answers:
        return None
    return HostIsolation(
        isolated=all(answer.isolated for answer in answers),
        note=" ".join(answer.note for answer in answers if answer.note),
    )


def job_isolation_note(job: Job) -> str:
    """What the job may use and reach where it runs, for its page."""
    notes = [get_backend(job.backend).isolation_note(job), checkpoint_store().isolation_note()]
    return " ".join(note for note in notes if note)


@dataclass(frozen=True)
class JobCheckpoints:
    """A job's complete checkpoints (newest first), where each of its later starts
    resumed from, and why the store couldn't be read (else empty)."""

    checkpoints: list[Checkpoint]
    resumes: list[JobResume]
    unavailable: str = ""


def job_checkpoints(*, job: Job) -> JobCheckpoints:
    """Reads the checkpoint store (one listing of the job's prefix, one read per
    manifest): a partial checkpoint is not among them."""
    resumes = list(JobResume.objects.filter(job=job))
    store = checkpoint_store()
    try:
        found = store.checkpoints(job_prefix(tenant_id=job.tenant_id, job_id=job.pk))
    except Exception as error:  # an unreachable store must not take the job page down
        log.warning("job %s: the checkpoint store could not be read: %s", job.pk, error)
        return JobCheckpoints([], resumes, "The checkpoint store could not be read just now.")
    return JobCheckpoints(list(reversed(found)), resumes)


def checkpoint_manifest_url(*, job: Job, checkpoint: Checkpoint) -> str:
    """Where a checkpoint's manifest lies in the store (as the job sees it outside a sandbox)."""
    prefix = job_prefix(tenant_id=job.tenant_id, job_id=job.pk)
    return checkpoint_store().object_url(prefix + checkpoint.manifest_key)
