"""Writes for jobs: launch, admission, dispatch, user actions, observed state.

Status changes go through jobs.state.job_transition only; backend calls happen in tasks
after commit, never inside an open transaction.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, Count, F, IntegerField, Q, Sum, Value, When
from django.utils import timezone

from console.crypto import encrypt_json
from console.models import Tenant, User
from console.services import ServiceError, audit_record
from jobs.backends import BackendRejected, BackendUnavailable, Observation, get_backend
from jobs.models import FINISHED, HOLDING_COMPUTE, Job, JobStatus, Priority
from jobs.state import IllegalTransition, job_note, job_reason_update, job_transition
from marketplace.models import GpuType, Image, NodePool, Region, TenantQuota, Tier

log = logging.getLogger(__name__)
S = JobStatus
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV_PREFIXES = ("GPUGEEK_",)
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
MAX_COMMAND_ARGS = 256


@dataclass
class JobSpec:
    """What a user asks to run; validated by `spec_validate`."""

    name: str
    image: str
    command: list[str]
    nodes: int = 1
    gpus_per_node: int = 0
    gpu_type: str | None = None
    cpus: int | None = None
    region: str | None = None
    spot_ratio: Decimal = Decimal(0)
    priority: str = Priority.NORMAL
    max_runtime_minutes: int = 24 * 60
    checkpoint_path: str = ""
    project: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict)
    auto_release: bool = True
    ports: list[dict] = field(default_factory=list)
    # Names of tenant secrets to inject as environment variables of the same name.
    secrets: list[str] = field(default_factory=list)


@dataclass
class Placement:
    backend: str
    pool: NodePool | None
    spot_pool: NodePool | None
    spot_nodes: int
    on_demand_nodes: int


def _invalid(message: str, field_name: str) -> ServiceError:
    return ServiceError(message, field=field_name)


def _validate_env(env: dict, field_name: str) -> dict[str, str]:
    if not isinstance(env, dict):
        raise _invalid("Environment variables are an object of NAME: value.", field_name)
    clean = {}
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise _invalid(
                f"“{key}” is not a valid variable name (letters, digits, _; not "
                "starting with a digit).",
                field_name,
            )
        if key.startswith(RESERVED_ENV_PREFIXES):
            raise _invalid(
                f"{key}: names starting with GPUGEEK_ are set by the platform.", field_name
            )
        if not isinstance(value, (str, int, float, bool)):
            raise _invalid(f"{key}: values are strings.", field_name)
        clean[key] = str(value)
    return clean


PORT_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,13}[a-z0-9])?$")


def _validate_ports(ports) -> None:
    """Ports to expose (Jupyter, SSH…): [{"name": "jupyter", "port": 8888}], at most 8."""
    if not isinstance(ports, list) or len(ports) > 8:
        raise _invalid("Ports are a list of at most 8 {name, port} objects.", "ports")
    names, numbers = set(), set()
    for port in ports:
        if not isinstance(port, dict) or set(port) != {"name", "port"}:
            raise _invalid('Each port is {"name": "jupyter", "port": 8888}.', "ports")
        name, number = port["name"], port["port"]
        if not isinstance(name, str) or not PORT_NAME_RE.match(name):
            raise _invalid(
                f"Port name “{name}”: lower-case letters, digits and -, up to 15.", "ports"
            )
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 65535:
            raise _invalid(f"Port {number!r} is not a TCP port number.", "ports")
        if number == 29500 or name in names or number in numbers:
            raise _invalid(
                f"Port {name}/{number} clashes with another (29500 is rendezvous).", "ports"
            )
        names.add(name)
        numbers.add(number)


def spot_nodes_for(nodes: int, spot_ratio: Decimal) -> int:
    """round(nodes × ratio), halves up: a single node goes to spot at ratio ≥ 0.5."""
    return int((Decimal(nodes) * Decimal(spot_ratio)).quantize(Decimal(1), ROUND_HALF_UP))


def _pick_pool(*, gpu_type: GpuType | None, region: Region, tier: str) -> NodePool | None:
    pools = NodePool.objects.filter(
        gpu_type=gpu_type,
        region=region,
        tier=tier,
        is_active=True,
        backend__in=settings.COMPUTE_BACKENDS,
    )
    if gpu_type is None:
        return pools.order_by("-allocatable_vcpus", "pk").first()
    return pools.order_by("-allocatable_gpus", "pk").first()


@dataclass
class ResolvedSpec:
    spec: JobSpec
    image: Image
    gpu_type: GpuType | None
    region: Region
    cpus: int
    placement: Placement


def spec_validate(*, tenant: Tenant, spec: JobSpec) -> ResolvedSpec:
    """Check a spec against the catalog, pools and quota maxima. Raises ServiceError with
    the field at fault; a request that fits the limits but not the free capacity is valid
    (it queues)."""
    name = (spec.name or "").strip()
    if not name or len(name) > 100:
        raise _invalid("Give the job a name (up to 100 characters).", "name")
    if (
        not isinstance(spec.command, list)
        or not spec.command
        or not all(isinstance(arg, str) for arg in spec.command)
    ):
        raise _invalid(
            "The command is a non-empty list of strings (argv); it is never run through a shell.",
            "command",
        )
    if len(spec.command) > MAX_COMMAND_ARGS or any("\x00" in arg for arg in spec.command):
        raise _invalid("The command is too long or contains NUL bytes.", "command")
    if spec.nodes < 1:
        raise _invalid("Ask for at least one node.", "nodes")
    if spec.gpus_per_node < 0:
        raise _invalid("GPUs per node can't be negative.", "gpus_per_node")
    if not Decimal(0) <= Decimal(spec.spot_ratio) <= Decimal(1):
        raise _invalid("The spot ratio is between 0 and 1.", "spot_ratio")
    if spec.max_runtime_minutes is None or spec.max_runtime_minutes <= 0:
        raise _invalid("The maximum runtime must be more than zero minutes.", "max_runtime_minutes")
    if spec.priority not in Priority.values:
        raise _invalid("Priority is critical, normal or low.", "priority")
    if not isinstance(spec.labels, dict) or not all(
        isinstance(k, str) and LABEL_KEY_RE.match(k) and isinstance(v, str) and len(v) <= 63
        for k, v in spec.labels.items()
    ):
        raise _invalid(
            "Labels are short key: value strings (keys: letters, digits, . _ -).", "labels"
        )
    _validate_env(spec.env, "env")
    _validate_env(spec.secret_env, "secret_env")
    _validate_ports(spec.ports)
    overlap = set(spec.env) & set(spec.secret_env)
    if overlap:
        raise _invalid(f"{', '.join(sorted(overlap))} is both plain and secret.", "secret_env")

    gpu_type = None
    if spec.gpu_type:
        gpu_type = GpuType.objects.filter(slug=spec.gpu_type, is_active=True).first()
        if gpu_type is None:
            raise _invalid(f"Unknown GPU type “{spec.gpu_type}”.", "gpu_type")
        if spec.gpus_per_node < 1:
            raise _invalid("A GPU job needs at least one GPU per node.", "gpus_per_node")
    elif spec.gpus_per_node:
        raise _invalid("Choose a GPU type for a GPU job.", "gpu_type")

    region_slug = spec.region or "local"
    region = Region.objects.filter(slug=region_slug, is_active=True).first()
    if region is None:
        raise _invalid(f"Unknown region “{region_slug}”.", "region")

    image = Image.objects.for_tenant(tenant).filter(slug=spec.image, is_active=True).first()
    if image is None:
        raise _invalid(f"Unknown image “{spec.image}”.", "image")
    hardware = gpu_type.vendor if gpu_type else "cpu"
    if hardware not in image.compatible_with:
        raise _invalid(
            f"{image.name} doesn't run on {hardware.upper()}; pick an image made for it.", "image"
        )

    spot_nodes = spot_nodes_for(spec.nodes, Decimal(spec.spot_ratio))
    on_demand_nodes = spec.nodes - spot_nodes
    pool = (
        _pick_pool(gpu_type=gpu_type, region=region, tier=Tier.ON_DEMAND)
        if on_demand_nodes
        else None
    )
    spot_pool = _pick_pool(gpu_type=gpu_type, region=region, tier=Tier.SPOT) if spot_nodes else None
    what = gpu_type.slug if gpu_type else "CPU"
    if on_demand_nodes and pool is None:
        raise _invalid(
            f"No on-demand {what} pool in {region.slug} on this installation's "
            f"backends ({', '.join(settings.COMPUTE_BACKENDS)}).",
            "region",
        )
    if spot_nodes and spot_pool is None:
        raise _invalid(f"No spot {what} pool in {region.slug}; lower the spot ratio.", "spot_ratio")
    if pool and spot_pool and pool.backend != spot_pool.backend:
        raise _invalid("Spot and on-demand nodes of one job must be on one backend.", "spot_ratio")
    chosen = pool or spot_pool
    cpus = spec.cpus or (chosen.vcpus_per_node if gpu_type and chosen.vcpus_per_node else 1)
    if cpus < 1:
        raise _invalid("Ask for at least one vCPU per node.", "cpus")

    # Larger than the pool could ever hold: refuse now rather than queue forever.
    for tier_pool, tier_nodes in ((pool, on_demand_nodes), (spot_pool, spot_nodes)):
        if not tier_pool:
            continue
        if gpu_type and spec.gpus_per_node > max(tier_pool.gpus_per_node, 0):
            raise _invalid(
                f"{tier_pool.name} has {tier_pool.gpus_per_node} GPUs per node; "
                f"{spec.gpus_per_node} asked.",
                "gpus_per_node",
            )
        if gpu_type and tier_nodes * spec.gpus_per_node > tier_pool.total_gpus:
            raise _invalid(
                f"{tier_pool.name} has {tier_pool.total_gpus} GPUs in all; "
                f"{tier_nodes * spec.gpus_per_node} asked.",
                "nodes",
            )
        if not gpu_type and tier_nodes * cpus > tier_pool.allocatable_vcpus:
            raise _invalid(
                f"{tier_pool.name} has {tier_pool.allocatable_vcpus} vCPUs in all; "
                f"{tier_nodes * cpus} asked.",
                "cpus",
            )
    total_gpus = spec.nodes * spec.gpus_per_node
    for quota in TenantQuota.objects.for_tenant(tenant).select_related("gpu_type"):
        if quota.max_gpus is None or not gpu_type:
            continue
        if (quota.gpu_type_id in (None, gpu_type.pk)) and total_gpus > quota.max_gpus:
            scope = quota.gpu_type.slug if quota.gpu_type else "all GPU types"
            raise _invalid(
                f"Your organisation's quota allows at most {quota.max_gpus} GPUs "
                f"({scope}); this job asks for {total_gpus}.",
                "nodes",
            )
    return ResolvedSpec(
        spec=spec,
        image=image,
        gpu_type=gpu_type,
        region=region,
        cpus=cpus,
        placement=Placement(
            backend=chosen.backend,
            pool=pool,
            spot_pool=spot_pool,
            spot_nodes=spot_nodes,
            on_demand_nodes=on_demand_nodes,
        ),
    )


def _enqueue(task_name: str, job_id: int) -> None:
    """Queue a task after commit; a broker outage leaves the job for the reconciler."""
    from jobs import tasks

    task = getattr(tasks, task_name)

    def send() -> None:
        try:
            task.delay(job_id)
        except Exception:
            log.exception(
                "could not queue %s for job %s; the reconciler will retry", task_name, job_id
            )

    transaction.on_commit(send)


def job_submit(
    *,
    tenant: Tenant,
    user: User | None,
    spec: JobSpec,
    idempotency_key: str | None = None,
    request=None,
) -> Job:
    """Validate and record a launch; it is admitted now if it fits, else it queues."""
    if idempotency_key:
        existing = Job.objects.for_tenant(tenant).filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
    resolved = spec_validate(tenant=tenant, spec=spec)
    from billing.services import budget_blocks_launch

    blocking = budget_blocks_launch(tenant=tenant, project=spec.project, priority=spec.priority)
    if blocking is not None:
        raise ServiceError(
            f"Budget “{blocking.name}” is used up for this month: only critical jobs can be "
            "launched until it is raised or the month ends.",
            code="payment_required",
        )
    placement = resolved.placement
    secret_env = {**tenant_secrets_resolve(tenant=tenant, names=spec.secrets), **spec.secret_env}
    try:
        with transaction.atomic():
            job = Job.objects.create(
                tenant=tenant,
                created_by=user,
                name=spec.name.strip(),
                project=spec.project,
                labels=spec.labels,
                image=resolved.image,
                image_reference=resolved.image.reference,
                command=spec.command,
                env=_validate_env(spec.env, "env"),
                secret_env_encrypted=encrypt_json(secret_env) if secret_env else "",
                secret_env_names=sorted(secret_env),
                gpu_type=resolved.gpu_type,
                gpus_per_node=spec.gpus_per_node,
                cpus=resolved.cpus,
                nodes=spec.nodes,
                region=resolved.region,
                spot_ratio=Decimal(spec.spot_ratio),
                priority=spec.priority,
                max_runtime_minutes=spec.max_runtime_minutes,
                checkpoint_path=spec.checkpoint_path,
                auto_release=spec.auto_release,
                ports=spec.ports,
                backend=placement.backend,
                pool=placement.pool,
                spot_pool=placement.spot_pool,
                spot_nodes=placement.spot_nodes,
                on_demand_nodes=placement.on_demand_nodes,
                status=S.QUEUED,
                status_reason="waiting for admission",
                idempotency_key=idempotency_key or "",
            )
            job_note(job=job, actor=user.email if user else "system", reason="submitted")
            audit_record(
                action="job.launched",
                tenant=tenant,
                actor=user,
                target=job,
                request=request,
                metadata={"gpus": job.total_gpus, "nodes": job.nodes, "image": job.image_reference},
            )
            job_admit_submitted(job=job)
    except IntegrityError:
        existing = Job.objects.for_tenant(tenant).filter(idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return existing
    job.refresh_from_db()
    return job


# --- tenant secrets ----


def tenant_secrets_resolve(*, tenant: Tenant, names: list[str]) -> dict[str, str]:
    """Values of the named tenant secrets, copied into the job at launch (a later change
    of the secret applies to later launches)."""
    from console.crypto import decrypt_json
    from jobs.models import TenantSecret

    if not names:
        return {}
    found = {s.name: s for s in TenantSecret.objects.for_tenant(tenant).filter(name__in=names)}
    missing = sorted(set(names) - set(found))
    if missing:
        raise _invalid(f"No secret named {', '.join(missing)} in your organisation.", "secrets")
    return {name: decrypt_json(found[name].value_encrypted)["value"] for name in names}


@transaction.atomic
def tenant_secret_set(*, tenant: Tenant, user: User, name: str, value: str, request=None):
    from jobs.models import TenantSecret

    name = (name or "").strip()
    if not ENV_NAME_RE.match(name) or name.startswith(RESERVED_ENV_PREFIXES):
        raise _invalid("Secret names are environment variable names, e.g. HF_TOKEN.", "name")
    if not value:
        raise _invalid("Give the secret a value.", "value")
    secret, created = TenantSecret.objects.update_or_create(
        tenant=tenant,
        name=name,
        defaults={"value_encrypted": encrypt_json({"value": value}), "created_by": user},
    )
    audit_record(
        action="secret.created" if created else "secret.updated",
        tenant=tenant,
        actor=user,
        target=secret,
        request=request,
        metadata={"name": name},
    )
    return secret


@transaction.atomic
def tenant_secret_delete(*, secret, user: User, request=None) -> None:
    audit_record(
        action="secret.deleted",
        tenant=secret.tenant,
        actor=user,
        target=secret,
        request=request,
        metadata={"name": secret.name},
    )
    secret.delete()


# --- admission ------------------------------------------------------------------------


@dataclass
class _Usage:
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


def _usage(*, pool_ids: Iterable[int] | None = None, tenant_id: int | None = None) -> _Usage:
    """Compute held, summed in the database (one row per pool/tenant and GPU type, not per
    job). `pool_ids`/`tenant_id` narrow it to what one admission decision reads."""
    usage = _Usage()
    holding = Job.objects.holding_compute().order_by()
    for pool_field, nodes_field in (("pool_id", "on_demand_nodes"), ("spot_pool_id", "spot_nodes")):
        rows = holding.filter(**{f"{pool_field}__isnull": False})
        if pool_ids is not None:
            rows = rows.filter(**{f"{pool_field}__in": list(pool_ids)})
        for row in rows.values(pool_field).annotate(
            gpus=Sum(F(nodes_field) * F("gpus_per_node")), vcpus=Sum(F(nodes_field) * F("cpus"))
        ):
            usage.pool_gpus[row[pool_field]] += row["gpus"] or 0
            usage.pool_vcpus[row[pool_field]] += row["vcpus"] or 0
    rows = holding if tenant_id is None else holding.filter(tenant_id=tenant_id)
    for row in rows.values("tenant_id", "gpu_type_id").annotate(
        gpus=Sum(F("nodes") * F("gpus_per_node")), jobs=Count("pk")
    ):
        usage.tenant_gpus[(row["tenant_id"], row["gpu_type_id"])] += row["gpus"] or 0
        usage.tenant_jobs[row["tenant_id"]] += row["jobs"]
    return usage


def _free(pool: NodePool, used_gpus: int, used_vcpus: int) -> int:
    if pool.gpu_type_id:
        return pool.allocatable_gpus - used_gpus
    return pool.allocatable_vcpus - used_vcpus


def _blocking_reason(
    job: Job, pools: dict[int, NodePool], usage: _Usage, quotas: dict[int, list[TenantQuota]]
) -> str | None:
    for pool_id, nodes in ((job.pool_id, job.on_demand_nodes), (job.spot_pool_id, job.spot_nodes)):
        if not pool_id:
            continue
        pool = pools.get(pool_id)
        if pool is None:
            return "its pool is no longer active"
        need = nodes * (job.gpus_per_node if pool.gpu_type_id else job.cpus)
        free = _free(pool, usage.pool_gpus[pool_id], usage.pool_vcpus[pool_id])
        if need > free:
            unit = "GPUs" if pool.gpu_type_id else "vCPUs"
            return f"waiting for {need} {unit} in {pool.name} ({max(free, 0)} free)"
    for quota in quotas.get(job.tenant_id, []):
        if (
            quota.gpu_type_id is None
            and quota.max_concurrent_jobs is not None
            and usage.tenant_jobs[job.tenant_id] >= quota.max_concurrent_jobs
        ):
            return f"quota: at most {quota.max_concurrent_jobs} jobs at once"
        if quota.max_gpus is None or not job.gpu_type_id:
            continue
        if quota.gpu_type_id == job.gpu_type_id:
            held = usage.tenant_gpus[(job.tenant_id, job.gpu_type_id)]
        elif quota.gpu_type_id is None:
            held = sum(v for (t, _), v in usage.tenant_gpus.items() if t == job.tenant_id)
        else:
            continue
        if held + job.total_gpus > quota.max_gpus:
            return f"quota: {held} of {quota.max_gpus} GPUs in use"
    return None


PRIORITY_ORDER = (Priority.CRITICAL, Priority.NORMAL, Priority.LOW)
# Reasons that hold a queued job back by its own tenant's quota: such a job blocks only
# that tenant's later jobs for its pools, never another tenant's.
QUOTA_WAIT_PREFIXES = ("quota", "waiting behind your organisation")
BEHIND_IN_POOL = "waiting behind earlier jobs for the same pool"
BEHIND_OWN_QUOTA = "waiting behind your organisation's earlier jobs (quota)"


def queued_in_order():
    rank = Case(
        *[When(priority=p, then=Value(r)) for r, p in enumerate(PRIORITY_ORDER)],
        output_field=IntegerField(),
    )
    return (
        Job.objects.filter(status=S.QUEUED)
        .annotate(priority_rank=rank)
        .order_by("priority_rank", "created_at", "pk")
    )


def queued_ahead_of(job: Job):
    """Queued jobs before `job` in admission order (priority, then FIFO) that want one of
    its pools; an indexed filter, so its cost doesn't grow with the rest of the queue."""
    pools = [pid for pid in (job.pool_id, job.spot_pool_id) if pid]
    rank = PRIORITY_ORDER.index(job.priority)
    earlier = Q(priority__in=PRIORITY_ORDER[:rank]) | Q(
        Q(created_at__lt=job.created_at) | Q(created_at=job.created_at, pk__lt=job.pk),
        priority=job.priority,
    )
    return _queued_in_pools(pools).filter(earlier).exclude(pk=job.pk)


def _queued_behind(job: Job):
    """Queued jobs after `job` in admission order that want one of its pools."""
    pools = [pid for pid in (job.pool_id, job.spot_pool_id) if pid]
    rank = PRIORITY_ORDER.index(job.priority)
    later = Q(priority__in=PRIORITY_ORDER[rank + 1 :]) | Q(
        Q(created_at__gt=job.created_at) | Q(created_at=job.created_at, pk__gt=job.pk),
        priority=job.priority,
    )
    return _queued_in_pools(pools).filter(later).exclude(pk=job.pk)


def _quota_wait(field_name: str = "status_reason") -> Q:
    q = Q()
    for prefix in QUOTA_WAIT_PREFIXES:
        q |= Q(**{f"{field_name}__startswith": prefix})
    return q


def job_admit_submitted(*, job: Job) -> bool:
    """Admission of one just-queued job, at a cost independent of the queue's length.

    It keeps `jobs_admit`'s order: if a job ranked before it (higher priority, or same
    priority and earlier) waits for one of its pools, it waits too (no overtaking), unless
    that job is held only by another tenant's quota; otherwise it is checked against the
    free capacity and its tenant's quota. The queue isn't re-examined: nothing freed
    compute since the last full pass (`jobs_admit` runs whenever a job ends, pauses or is
    cancelled, and in the reconciler), so every job already queued still doesn't fit.
    Returns whether it was admitted; its reason says why not. When it goes before jobs
    already waiting for its pools, a full pass follows. Figures that other waiting jobs
    quote ("2 free") refresh at the next full pass.
    """
    pool_ids = sorted(pid for pid in (job.pool_id, job.spot_pool_id) if pid)
    with transaction.atomic():
        # The same row locks as jobs_admit (pools, in pk order) serialise admissions of a
        # pool; the tenant's quota rows serialise its admissions across pools.
        pools = {
            p.pk: p
            for p in NodePool.objects.select_for_update()
            .filter(pk__in=pool_ids, is_active=True)
            .order_by("pk")
        }
        quotas: dict[int, list[TenantQuota]] = defaultdict(list)
        for quota in TenantQuota.objects.for_tenant(job.tenant).select_for_update().order_by("pk"):
            quotas[quota.tenant_id].append(quota)
        mine, quota_wait = Q(tenant_id=job.tenant_id), _quota_wait()
        ahead = queued_ahead_of(job).aggregate(
            others_capacity=Count("pk", filter=~mine & ~quota_wait),
            own_capacity=Count("pk", filter=mine & ~quota_wait),
            own_quota=Count("pk", filter=mine & quota_wait),
        )
        # Another tenant's job held only by its quota blocks nobody else (as in jobs_admit).
        if ahead["others_capacity"] or ahead["own_capacity"]:
            reason = BEHIND_IN_POOL
        elif ahead["own_quota"]:
            reason = BEHIND_OWN_QUOTA
        else:
            usage = _usage(pool_ids=pool_ids, tenant_id=job.tenant_id)
            reason = _blocking_reason(job, pools, usage, quotas)
        if reason:
            if job.status_reason != reason:
                Job.objects.filter(pk=job.pk).update(status_reason=reason)
                job.status_reason = reason
            others = _queued_behind(job)
        else:
            job_transition(job=job, to=S.DISPATCHING, actor="system", reason="admitted")
            _enqueue("job_dispatch_task", job.pk)
            others = _queued_in_pools(pool_ids)
        if others.exists():
            # It went past waiting jobs (a higher priority, or another tenant's quota
            # wait): that can change what holds them back (capacity taken turns a quota
            # wait into a pool wait; a new quota wait ahead frees the pool for others),
            # so a full pass re-sorts them. A launch into a pool where it is last, the
            # common case, skips this.
            jobs_admit()
            job.refresh_from_db()
        return job.status == S.DISPATCHING


def _queued_in_pools(pool_ids: list[int]):
    return Job.objects.filter(status=S.QUEUED).filter(
        Q(pool_id__in=pool_ids) | Q(spot_pool_id__in=pool_ids)
    )


@transaction.atomic
def jobs_admit() -> list[Job]:
    """Admit queued jobs in priority, then FIFO, order while they fit.

    A job that doesn't fit its pool blocks later jobs for that pool (no overtaking);
    a job held back by its tenant's quota blocks only that tenant's later jobs there.
    """
    pools = {
        p.pk: p for p in NodePool.objects.select_for_update().filter(is_active=True).order_by("pk")
    }
    usage = _usage()
    quotas: dict[int, list[TenantQuota]] = defaultdict(list)
    for quota in TenantQuota.objects.all():
        quotas[quota.tenant_id].append(quota)
    blocked_pools: set[int] = set()
    # (tenant, pool) pairs held back by the tenant's quota: its later jobs there wait too.
    blocked_by_quota: set[tuple[int, int]] = set()
    admitted = []
    for job in queued_in_order().select_for_update():
        job_pools = {pid for pid in (job.pool_id, job.spot_pool_id) if pid}
        if job_pools & blocked_pools:
            reason = BEHIND_IN_POOL
        elif {(job.tenant_id, pid) for pid in job_pools} & blocked_by_quota:
            reason = BEHIND_OWN_QUOTA
        else:
            reason = _blocking_reason(job, pools, usage, quotas)
        if reason:
            if reason.startswith("quota"):
                blocked_by_quota |= {(job.tenant_id, pid) for pid in job_pools}
            elif reason != BEHIND_OWN_QUOTA:
                blocked_pools |= job_pools
            if job.status_reason != reason:
                Job.objects.filter(pk=job.pk).update(status_reason=reason)
            continue
        usage.add(job)
        job_transition(job=job, to=S.DISPATCHING, actor="system", reason="admitted")
        _enqueue("job_dispatch_task", job.pk)
        admitted.append(job)
    return admitted


def queue_position(job: Job) -> int | None:
    from jobs.selectors import queue_positions

    return queue_positions([job]).get(job.pk)


# --- dispatch ------------------------------------------------------------------------------


def job_dispatch(*, job: Job) -> Job:
    """Start the admitted job's attempt on its backend. Safe to run twice."""
    job.refresh_from_db()
    if job.status != S.DISPATCHING:
        return job  # done already, or cancelled meanwhile
    backend = get_backend(job.backend)
    try:
        if job.backend == "local":
            _assign_local_devices(job, backend)
        backend.submit(job)
    except BackendUnavailable as error:
        # Touching status_changed_at tells the reconciler a retry is under way.
        Job.objects.filter(pk=job.pk).update(
            status_reason=f"retrying: {error}"[:500], status_changed_at=timezone.now()
        )
        raise
    except BackendRejected as error:
        return _transition_quietly(job, S.FAILED, "system", f"dispatch failed: {error}")
    # The local backend starts the process at once; Kubernetes still has to schedule pods.
    target = S.RUNNING if job.backend == "local" else S.PROVISIONING
    return _transition_quietly(
        job, target, "system", "started" if target == S.RUNNING else "submitted to the cluster"
    )


@transaction.atomic
def _assign_local_devices(job: Job, backend) -> None:
    if not job.gpus_per_node or job.assigned_devices:
        return
    busy = set()
    for other in Job.objects.filter(backend="local").holding_compute().exclude(pk=job.pk):
        busy.update(other.assigned_devices or [])
    job.assigned_devices = backend.assign_devices(job, busy)
    Job.objects.filter(pk=job.pk).update(assigned_devices=job.assigned_devices)


def _transition_quietly(job: Job, to: str, actor: str, reason: str, **changes) -> Job:
    """Apply a transition a racing action may already have made moot (e.g. a cancel)."""
    try:
        return job_transition(job=job, to=to, actor=actor, reason=reason, **changes)
    except IllegalTransition:
        job.refresh_from_db()
        return job


# --- user actions ---------------------------------------------------------------------------


class ActionRefused(ServiceError):
    def __init__(self, message: str):
        super().__init__(message, code="conflict")


def job_pause(
    *,
    job: Job,
    actor: str,
    reason: str = "paused by user",
    by_budget: bool = False,
    quiet_if_done: bool = True,
) -> Job:
    """Pause a running job. Repeating is a no-op, unless `quiet_if_done` is False (then it
    refuses, so a caller such as the budget can tell it didn't make the pause)."""
    job.refresh_from_db()
    if job.status in (S.PAUSING, S.PAUSED):
        if quiet_if_done:
            return job
        raise ActionRefused(f"The job is already {job.status}.")
    if job.status not in (S.RUNNING, S.PROVISIONING):
        raise ActionRefused(f"Only a running job can be paused; this one is {job.status}.")
    with transaction.atomic():
        job = job_transition(
            job=job, to=S.PAUSING, actor=actor, reason=reason, paused_by_budget=by_budget
        )
        _enqueue("job_suspend_task", job.pk)
    return job


def job_resume(*, job: Job, actor: str, reason: str = "resumed by user") -> Job:
    job.refresh_from_db()
    if job.status in (S.RESUMING, S.RUNNING, S.PROVISIONING):
        return job
    if job.status != S.PAUSED:
        raise ActionRefused(f"Only a paused job can be resumed; this one is {job.status}.")
    with transaction.atomic():
        # A paused job released its compute: it must fit again, like a new admission.
        pools = {
            p.pk: p
            for p in NodePool.objects.select_for_update().filter(is_active=True).order_by("pk")
        }
        quotas: dict[int, list[TenantQuota]] = defaultdict(list)
        for quota in TenantQuota.objects.for_tenant(job.tenant):
            quotas[quota.tenant_id].append(quota)
        blocked = _blocking_reason(job, pools, _usage(), quotas)
        if blocked:
            raise ActionRefused(
                f"Not enough free capacity to resume now ({blocked}); try "
                "again when other jobs finish."
            )
        job = job_transition(
            job=job, to=S.RESUMING, actor=actor, reason=reason, paused_by_budget=False
        )
        _enqueue("job_resume_task", job.pk)
    return job


def job_backend_resume(*, job: Job) -> Job:
    """Task side of a resume: start the suspended attempt again on its backend."""
    job.refresh_from_db()
    if job.status != S.RESUMING:
        return job
    backend = get_backend(job.backend)
    try:
        if job.backend == "local":
            _assign_local_devices(job, backend)
        backend.resume(job)
    except BackendRejected as error:
        return _transition_quietly(job, S.FAILED, "system", f"resume failed: {error}")
    if job.backend == "local":
        return _transition_quietly(job, S.RUNNING, "system", "resumed from the checkpoint")
    return job


def job_cancel(*, job: Job, actor: str, reason: str = "cancelled by user") -> Job:
    job.refresh_from_db()
    if job.status == S.CANCELLED:
        return job
    if job.status in FINISHED:
        raise ActionRefused(f"The job has already {job.status}.")
    with transaction.atomic():
        job = job_transition(job=job, to=S.CANCELLED, actor=actor, reason=reason)
        _enqueue("job_cancel_task", job.pk)
        jobs_admit()
    return job


def spec_from_job(job: Job) -> JobSpec:
    from console.crypto import decrypt_json

    return JobSpec(
        name=job.name,
        image=job.image.slug,
        command=list(job.command),
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        gpu_type=job.gpu_type.slug if job.gpu_type else None,
        cpus=job.cpus,
        region=job.region.slug,
        spot_ratio=job.spot_ratio,
        priority=job.priority,
        max_runtime_minutes=job.max_runtime_minutes,
        checkpoint_path=job.checkpoint_path,
        project=job.project,
        labels=dict(job.labels),
        env=dict(job.env),
        secret_env=decrypt_json(job.secret_env_encrypted),
        auto_release=job.auto_release,
        ports=list(job.ports),
    )


TEMPLATE_FIELDS = (
    "image",
    "command",
    "nodes",
    "gpus_per_node",
    "gpu_type",
    "cpus",
    "region",
    "spot_ratio",
    "priority",
    "max_runtime_minutes",
    "checkpoint_path",
    "project",
    "labels",
    "env",
    "auto_release",
    "ports",
    "secrets",
)


@transaction.atomic
def launch_template_save(*, job: Job, name: str, user: User | None, request=None):
    """Save a job's spec to launch again. Secret values are not copied: a template names
    organisation secrets instead, so rotating one takes effect on the next launch."""
    from jobs.models import LaunchTemplate

    name = (name or "").strip()
    if not name or len(name) > 100:
        raise _invalid("Give the template a name (up to 100 characters).", "name")
    spec = spec_from_job(job)
    values = {key: getattr(spec, key) for key in TEMPLATE_FIELDS if key != "secrets"}
    values["spot_ratio"] = str(values["spot_ratio"])
    values["secrets"] = []
    template, _ = LaunchTemplate.objects.update_or_create(
        tenant=job.tenant, name=name, defaults={"spec": values, "created_by": user}
    )
    audit_record(
        action="launch_template.saved",
        tenant=job.tenant,
        actor=user,
        target=template,
        request=request,
        metadata={"from_job": job.pk},
    )
    return template


def spec_from_template(template, *, name: str | None = None) -> JobSpec:
    values = {key: template.spec[key] for key in TEMPLATE_FIELDS if key in template.spec}
    values["spot_ratio"] = Decimal(str(values.get("spot_ratio", "0")))
    return JobSpec(name=name or template.name, **values)


def job_clone(*, job: Job, user: User | None, request=None) -> Job:
    spec = spec_from_job(job)
    spec.name = f"{job.name} (clone)"[:100]
    return job_submit(tenant=job.tenant, user=user, spec=spec, request=request)


def job_delete(*, job: Job, user: User | None, request=None) -> None:
    if not job.is_finished:
        raise ActionRefused("Only a finished job can be deleted; cancel it first.")
    from billing.metering import release_held_usage

    with transaction.atomic():
        # Its usage stays in the job rollups. (This waits for any metering tick to end,
        # and holds off the next until the job is gone.)
        release_held_usage([job.pk])
        audit_record(
            action="job.deleted", tenant=job.tenant, actor=user, target=job, request=request
        )
        job.delete()


# --- observed state ---------------------------------------------------------------------------


def job_apply_observation(*, job: Job, observation: Observation) -> Job:
    """Map what the backend sees onto the state machine (the watcher's single entry)."""
    phase, status = observation.phase, job.status
    if status in FINISHED:
        return job
    changes: dict[str, Any] = {}
    if observation.exit_code is not None:
        changes["exit_code"] = observation.exit_code
    if phase == "running" and status in (S.PROVISIONING, S.RESUMING, S.DISPATCHING):
        return _transition_quietly(job, S.RUNNING, "backend", "running")
    if phase == "pending" and status in (S.PROVISIONING, S.RESUMING) and observation.reason:
        # Why it isn't running yet (Kueue admission, scheduling, image pull): shown as is.
        return job_reason_update(job=job, reason=observation.reason)
    if phase == "succeeded" and status in HOLDING_COMPUTE:
        job = _transition_quietly(job, S.SUCCEEDED, "backend", "completed", **changes)
    elif phase == "failed" and status in HOLDING_COMPUTE:
        job = _transition_quietly(job, S.FAILED, "backend", observation.reason, **changes)
    elif phase in ("suspended", "cancelled") and status == S.PAUSING:
        # A budget pause keeps its reason (it names the budget) on the paused job.
        reason = (
            f"{job.status_reason}; compute released"
            if job.paused_by_budget
            else "stopped; compute released"
        )
        job = _transition_quietly(job, S.PAUSED, "backend", reason, assigned_devices=[], **changes)
    elif phase == "preempted" and status in (S.RUNNING, S.PROVISIONING, S.RESUMING):
        job = _transition_quietly(
            job, S.PREEMPTED, "backend", observation.reason or "spot capacity reclaimed"
        )
        if job.status == S.PREEMPTED:
            job = _transition_quietly(
                job,
                S.QUEUED,
                "system",
                "requeued as a new attempt from the checkpoint",
                attempt=job.attempt + 1,
                assigned_devices=[],
            )
    elif phase == "missing" and status in (S.RUNNING, S.PROVISIONING, S.RESUMING, S.PAUSING):
        job = _transition_quietly(job, S.FAILED, "backend", f"lost: {observation.reason}")
    else:
        return job
    if job.status not in HOLDING_COMPUTE:
        if job.status in FINISHED and job.backend != "local":
            _enqueue("job_release_task", job.pk)
        jobs_admit()
    return job


def jobs_observe(
    *, backend_name: str, now: datetime | None = None, job_ids: Iterable[int] | None = None
) -> int:
    """One watcher pass over a backend's live jobs: apply observations, enforce max
    runtime and grace periods. `job_ids` limits the pass to those jobs (the ones the
    Kubernetes watch saw change). Returns how many jobs were looked at."""
    now = now or timezone.now()
    backend = get_backend(backend_name)
    live = Job.objects.filter(
        backend=backend_name, status__in=[S.PROVISIONING, S.RUNNING, S.PAUSING, S.RESUMING]
    ).select_related("gpu_type")
    if job_ids is not None:
        live = live.filter(pk__in=list(job_ids))
    jobs = list(live)
    for job in jobs:
        try:
            if (
                job.status == S.RUNNING
                and job.started_at
                and (now - job.started_at).total_seconds() > job.max_runtime_minutes * 60
            ):
                _transition_quietly(
                    job,
                    S.FAILED,
                    "system",
                    f"exceeded the maximum runtime of {job.max_runtime_minutes} minutes",
                )
                backend.cancel(job)
                jobs_admit()
                continue
            job_apply_observation(job=job, observation=backend.observe(job))
        except BackendUnavailable as error:
            log.warning("observing job %s failed: %s", job.pk, error)
    if hasattr(backend, "enforce_grace"):
        # Jobs told to stop get SIGKILL once their grace period is over.
        recently_stopped = Job.objects.filter(
            backend=backend_name,
            status__in=[S.CANCELLED, S.FAILED, S.SUCCEEDED],
            finished_at__gte=now - timezone.timedelta(hours=1),
        )
        for job in [*Job.objects.filter(backend=backend_name, status=S.PAUSING), *recently_stopped]:
            backend.enforce_grace(job, settings.JOB_TERMINATION_GRACE_SECONDS)
    return len(jobs)


def jobs_reconcile(*, now: datetime | None = None, stuck_after_seconds: int = 60) -> list[int]:
    """Re-enqueue dispatches that never happened (lost task, broker outage)."""
    now = now or timezone.now()
    stuck = list(
        Job.objects.filter(
            status=S.DISPATCHING,
            status_changed_at__lt=now - timezone.timedelta(seconds=stuck_after_seconds),
        ).values_list("pk", flat=True)
    )
    for job_id in stuck:
        _enqueue("job_dispatch_task", job_id)
    jobs_admit()
    return stuck
