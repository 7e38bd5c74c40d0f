"""Writes of services: create, change (a new revision when what runs changes), scale,
roll back, delete, and their endpoint tokens.

The replicas themselves are started and stopped by `services.reconcile`, which makes them
match what these functions wrote; each write queues a reconcile after commit.
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone

from console.models import Tenant, User, sha256_hex
from console.queueing import enqueue_now, enqueue_on_commit
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from jobs.models import Priority
from marketplace.models import Backend
from services import checks, selectors, tasks
from services.checks import REVISION_FIELDS
from services.models import (
    CLUSTER_METRICS,
    AutoscaleMetric,
    ReplicaState,
    Service,
    ServiceAuth,
    ServiceReplica,
    ServiceRevision,
    ServiceStatus,
    ServiceToken,
)
from services.signals import replicas_removing, service_creating


@dataclass
class ServiceSpec:
    """What a user asks for; validated by `service_create` / `service_update`."""

    name: str
    image: str
    command: list[str]
    port: int
    region: str
    cpus: int = 1
    # GPU replicas (on a cluster): the GPU type's slug and GPUs per replica (1 by default
    # once a type is named).
    gpu_type: str | None = None
    gpus_per_replica: int = 0
    min_replicas: int = 2
    max_replicas: int = 10
    readiness_path: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)  # organisation secrets, by name
    # Volumes every replica mounts read-only: [{"name": "weights", "path": "/models"}].
    volumes: list[dict] = field(default_factory=list)
    auth: str = ServiceAuth.TOKEN
    autoscale_metric: str = AutoscaleMetric.CONCURRENCY
    autoscale_target: float = 10
    scale_down_delay: int = 300
    priority: str = Priority.NORMAL


def _revision(service: Service, *, copied_from: ServiceRevision | None = None) -> ServiceRevision:
    number = service.revisions.order_by("-number").values_list("number", flat=True).first() or 0
    revision = ServiceRevision.objects.create(
        service=service,
        number=number + 1,
        copied_from=copied_from,
        **{name: copy.deepcopy(getattr(service, name)) for name in REVISION_FIELDS},
    )
    service.current_revision = revision
    service.status = (
        ServiceStatus.SCALED_TO_ZERO if not service.min_replicas else (ServiceStatus.DEPLOYING)
    )
    service.save(update_fields=["current_revision", "status", "updated_at"])
    return revision


def _reconcile_after_commit(service: Service) -> None:
    enqueue_on_commit(tasks.service_reconcile_task, service.pk)


@transaction.atomic
def service_create(
    *, tenant: Tenant, user: User | None, spec: ServiceSpec, request: HttpRequest | None = None
) -> Service:
    """Create a service and its first revision; its replicas start after commit."""
    checks.check_name(spec.name)
    pool = checks.service_pool(tenant=tenant, region_slug=spec.region, gpu_type=spec.gpu_type)
    gpus = spec.gpus_per_replica
    if pool.gpu_type_id is not None and gpus == 0:
        gpus = 1
    values = {
        "image": spec.image,
        "command": spec.command,
        "env": spec.env,
        "secrets": spec.secrets,
        "volumes": spec.volumes,
        "port": spec.port,
        "cpus": spec.cpus,
        "gpus_per_replica": gpus,
    }
    checks.check_runtime(values, pool)
    checks.check_secrets(tenant=tenant, user=user, values=values)
    checks.check_volumes(tenant=tenant, region=pool.region, values=values)
    checks.check_scale(spec.min_replicas, spec.max_replicas)
    checks.check_gpu_quota(tenant=tenant, pool=pool, max_replicas=spec.max_replicas, gpus=gpus)
    checks.check_readiness(spec.readiness_path)
    checks.check_auth(spec.auth)
    checks.check_priority(tenant=tenant, user=user, priority=spec.priority)
    checks.check_autoscale(
        spec.autoscale_metric, spec.autoscale_target, pool=pool, min_replicas=spec.min_replicas
    )
    checks.check_image(tenant=tenant, image=spec.image, pool=pool)
    checks.check_scale_down_delay(spec.scale_down_delay)
    if Service.objects.for_tenant(tenant).filter(name=spec.name).exists():
        raise ServiceError(
            f"A service named “{spec.name}” exists already.",
            code=ErrorCode.CONFLICT,
            field="name",
        )
    service_creating.send(sender=Service, tenant=tenant, priority=spec.priority)
    try:
        with transaction.atomic():
            service = Service.objects.create(
                tenant=tenant,
                name=spec.name,
                region=pool.region,
                pool=pool,
                gpu_type=pool.gpu_type,
                min_replicas=spec.min_replicas,
                max_replicas=spec.max_replicas,
                desired_replicas=spec.min_replicas,  # until traffic says otherwise
                autoscale_metric=spec.autoscale_metric,
                autoscale_target=float(spec.autoscale_target),
                scale_down_delay=spec.scale_down_delay,
                readiness_path=spec.readiness_path,
                auth=spec.auth,
                priority=spec.priority,
                created_by=user,
                **values,
            )
    except IntegrityError:  # a concurrent create of the same name won
        raise ServiceError(
            f"A service named “{spec.name}” exists already.",
            code=ErrorCode.CONFLICT,
            field="name",
        ) from None
    _revision(service)
    audit_record(
        action="service.created",
        tenant=tenant,
        actor=user,
        target=service,
        request=request,
        metadata={"name": service.name, "image": service.image},
    )
    _reconcile_after_commit(service)
    return service


def _locked(service: Service) -> Service:
    return Service.objects.select_for_update().get(pk=service.pk)


@transaction.atomic
def service_update(
    *, service: Service, user: User | None, changes: dict[str, Any], request=None
) -> Service:
    """Change a service. A change of image, command, env, secrets, volumes, port, CPUs or
    GPUs per replica makes a new revision (its replicas replace the old ones once ready); scale,
    autoscaling, readiness path, auth and priority change in place."""
    service = _locked(service)
    runtime = {name: changes.get(name, getattr(service, name)) for name in REVISION_FIELDS}
    checks.check_runtime(runtime, service.pool)
    if "volumes" in changes:
        checks.check_volumes(tenant=service.tenant, region=service.region, values=runtime)
    if any(runtime[name] != getattr(service, name) for name in REVISION_FIELDS):
        # (a new command or image could print the secrets: whoever makes it must be
        # allowed to use them)
        checks.check_secrets(tenant=service.tenant, user=user, values=runtime)
    min_replicas = changes.get("min_replicas", service.min_replicas)
    max_replicas = changes.get("max_replicas", service.max_replicas)
    checks.check_scale(min_replicas, max_replicas)
    checks.check_gpu_quota(
        tenant=service.tenant,
        pool=service.pool,
        max_replicas=max_replicas,
        gpus=runtime["gpus_per_replica"],
    )
    readiness_path = changes.get("readiness_path", service.readiness_path)
    checks.check_readiness(readiness_path)
    auth = changes.get("auth", service.auth)
    checks.check_auth(auth)
    priority = changes.get("priority", service.priority)
    if priority != service.priority:
        checks.check_priority(tenant=service.tenant, user=user, priority=priority)
    metric = changes.get("autoscale_metric", service.autoscale_metric)
    target = changes.get("autoscale_target", service.autoscale_target)
    checks.check_autoscale(metric, target, pool=service.pool, min_replicas=min_replicas)
    if runtime["image"] != service.image:
        checks.check_image(tenant=service.tenant, image=runtime["image"], pool=service.pool)
    scale_down_delay = changes.get("scale_down_delay", service.scale_down_delay)
    checks.check_scale_down_delay(scale_down_delay)
    new_revision = any(runtime[name] != getattr(service, name) for name in REVISION_FIELDS)
    for name, value in runtime.items():
        setattr(service, name, value)
    service.min_replicas, service.max_replicas = min_replicas, max_replicas
    service.readiness_path, service.auth, service.priority = readiness_path, auth, priority
    service.autoscale_metric, service.autoscale_target = metric, float(target)
    service.scale_down_delay = scale_down_delay
    service.save()
    if new_revision:
        _revision(service)
    audit_record(
        action="service.updated",
        tenant=service.tenant,
        actor=user,
        target=service,
        request=request,
        metadata={"fields": sorted(changes), "revision": service.current_revision_id},
    )
    _reconcile_after_commit(service)
    return service


@transaction.atomic
def service_scale(
    *, service: Service, user: User | None, min_replicas: int, max_replicas: int, request=None
) -> Service:
    service = _locked(service)
    checks.check_scale(min_replicas, max_replicas)
    checks.check_gpu_quota(
        tenant=service.tenant,
        pool=service.pool,
        max_replicas=max_replicas,
        gpus=service.gpus_per_replica,
    )
    if service.autoscale_metric in CLUSTER_METRICS:
        checks.check_cpu_autoscale(
            service.autoscale_target,
            pool=service.pool,
            min_replicas=min_replicas,
            metric=service.autoscale_metric,
        )
    service.min_replicas, service.max_replicas = min_replicas, max_replicas
    service.save(update_fields=["min_replicas", "max_replicas", "updated_at"])
    audit_record(
        action="service.scaled",
        tenant=service.tenant,
        actor=user,
        target=service,
        request=request,
        metadata={"min_replicas": min_replicas, "max_replicas": max_replicas},
    )
    _reconcile_after_commit(service)
    return service


def service_wake(*, service_id: int) -> None:
    """A request waits at the gateway for a replica of the service: reconcile it now
    (the pass sees the waiting request and starts one) rather than on beat's schedule."""
    enqueue_now(tasks.service_reconcile_task, service_id)


def rollout_running(service: Service) -> bool:
    """Replicas of an older revision still run beside the current one."""
    return (
        service.replicas.exclude(state=ReplicaState.STOPPED)
        .exclude(revision_id=service.current_revision_id)
        .exists()
    )


@transaction.atomic
def service_rollback(
    *, service: Service, user: User | None, revision_number: Any, request=None
) -> Service:
    """Run an earlier revision again: a new revision that copies it (numbers only grow)."""
    service = _locked(service)
    if not isinstance(revision_number, int):
        raise ServiceError("Give the revision number to roll back to.", field="revision")
    earlier = service.revisions.filter(number=revision_number).first()
    if earlier is None:
        raise ServiceError(f"This service has no revision {revision_number}.", field="revision")
    if earlier.pk == service.current_revision_id:
        raise ServiceError(f"Revision {revision_number} is the one running.", field="revision")
    if rollout_running(service):
        raise ServiceError(
            "A rollout is still running; roll back once it has finished.",
            code=ErrorCode.CONFLICT,
        )
    values = {name: getattr(earlier, name) for name in REVISION_FIELDS}
    checks.check_secrets(tenant=service.tenant, user=user, values=values)  # (still there, allowed)
    checks.check_volumes(tenant=service.tenant, region=service.region, values=values)
    checks.check_gpu_quota(
        tenant=service.tenant,
        pool=service.pool,
        max_replicas=service.max_replicas,
        gpus=values["gpus_per_replica"],
    )
    for name, value in values.items():
        setattr(service, name, value)
    service.save()
    _revision(service, copied_from=earlier)
    audit_record(
        action="service.rolled_back",
        tenant=service.tenant,
        actor=user,
        target=service,
        request=request,
        metadata={"to": revision_number, "revision": service.current_revision_id},
    )
    _reconcile_after_commit(service)
    return service


def service_budget_pause(*, service: Service, reason: str) -> bool:
    """A used-up budget scales the service to zero: its replicas drain and go on the next
    pass, and the gateway answers 402 with `reason` meanwhile. False: paused already."""
    paused = Service.objects.filter(pk=service.pk, paused_by_budget=False).update(
        paused_by_budget=True, status=ServiceStatus.PAUSED, status_reason=reason[:300]
    )
    if paused:
        selectors.routes_forget(service_ids=[service.pk])  # (an update sends no post_save)
        audit_record(
            action="service.paused_by_budget",
            tenant=service.tenant,
            actor_label="budget",
            target=service,
            metadata={"reason": reason[:300]},
        )
        _reconcile_after_commit(service)
    return bool(paused)


def service_budget_resume(*, service: Service) -> bool:
    """The budget that paused it no longer blocks: back to `min_replicas` (then traffic
    decides) on the next pass. False: it wasn't paused by a budget."""
    resumed = Service.objects.filter(pk=service.pk, paused_by_budget=True).update(
        paused_by_budget=False, status=ServiceStatus.DEPLOYING, status_reason=""
    )
    if resumed:
        selectors.routes_forget(service_ids=[service.pk])
        audit_record(
            action="service.resumed_by_budget",
            tenant=service.tenant,
            actor_label="budget",
            target=service,
        )
        _reconcile_after_commit(service)
    return bool(resumed)


@transaction.atomic
def service_delete(*, service: Service, user: User | None, request=None) -> None:
    """Delete a service; its replicas' processes (or its cluster objects) are removed
    after commit."""
    handles = list(service.replicas.exclude(handle="").values_list("handle", flat=True))
    audit_record(
        action="service.deleted",
        tenant=service.tenant,
        actor=user,
        request=request,
        metadata={"name": service.name},
    )
    replicas = service.replicas.all()
    replicas.filter(stopped_at=None).update(stopped_at=timezone.now())  # stopped on commit
    replica_ids = list(replicas.values_list("pk", flat=True))
    if replica_ids:
        replicas_removing.send(sender=ServiceReplica, replica_ids=replica_ids)
    replicas.delete()  # (they protect their revisions)
    on_cluster = service.pool.backend == Backend.KUBERNETES
    tenant_id, service_id = service.tenant_id, service.pk
    service.delete()
    if on_cluster:  # (its Deployment's pods go with it)
        enqueue_on_commit(tasks.service_objects_delete_task, tenant_id, service_id)
        return
    for handle in handles:
        enqueue_on_commit(tasks.service_replica_discard_task, handle)


@transaction.atomic
def service_token_create(
    *, service: Service, user: User | None, name: str, request=None
) -> tuple[ServiceToken, str]:
    """A token for the service's endpoint; the raw value is returned once, only its hash
    kept."""
    if service.auth != ServiceAuth.TOKEN:
        raise ServiceError(
            "This service is public: it takes no tokens (set auth to token first).",
            field="auth",
        )
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ServiceError("Give the token a name of at most 100 characters.", field="name")
    raw = ServiceToken.PREFIX + secrets.token_urlsafe(32)
    token = ServiceToken.objects.create(
        service=service, name=name, prefix=raw[:12], key_hash=sha256_hex(raw), created_by=user
    )
    audit_record(
        action="service_token.created",
        tenant=service.tenant,
        actor=user,
        target=token,
        request=request,
        metadata={"service": service.name, "name": name, "prefix": token.prefix},
    )
    return token, raw


@transaction.atomic
def service_token_revoke(*, token: ServiceToken, user: User | None, request=None) -> ServiceToken:
    if token.revoked_at is not None:
        return token
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(
        action="service_token.revoked",
        tenant=token.service.tenant,
        actor=user,
        target=token,
        request=request,
        metadata={"service": token.service.name, "name": token.name},
    )
    return token
