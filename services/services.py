"""Writes of services: create, change (a new revision when what runs changes), scale,
roll back, delete, and their endpoint tokens.

The replicas themselves are started and stopped by `services.reconcile`, which makes them
match what these functions wrote; each write queues a reconcile after commit.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone

from console.models import Tenant, User, sha256_hex
from console.queueing import enqueue_now, enqueue_on_commit
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from jobs.models import Priority
from jobs.services import priority_allowed_check, tenant_secrets_resolve
from marketplace.models import NodePool, Region
from marketplace.selectors import HOST_NOT_AVAILABLE, may_run_on_host, pools_for_tenant
from services import selectors, tasks
from services.models import (
    DNS_LABEL,
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

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What makes a new revision when it changes.
REVISION_FIELDS = ("image", "command", "env", "secrets", "port", "cpus")


@dataclass
class ServiceSpec:
    """What a user asks for; validated by `service_create` / `service_update`."""

    name: str
    image: str
    command: list[str]
    port: int
    region: str
    cpus: int = 1
    min_replicas: int = 2
    max_replicas: int = 10
    readiness_path: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)  # organisation secrets, by name
    auth: str = ServiceAuth.TOKEN
    autoscale_metric: str = AutoscaleMetric.CONCURRENCY
    autoscale_target: float = 10
    scale_down_delay: int = 300
    priority: str = Priority.NORMAL


def _check_name(name: str) -> None:
    try:
        DNS_LABEL(name)
    except ValidationError:
        raise ServiceError(
            "Use lowercase letters, digits and hyphens for the name (a DNS label, at most "
            "63 characters, not starting or ending with a hyphen).",
            field="name",
        ) from None


def _check_runtime(values: dict[str, Any], pool: NodePool) -> None:
    image = values["image"]
    if not isinstance(image, str) or not image.strip() or len(image) > 300:
        raise ServiceError("Give the image to run (at most 300 characters).", field="image")
    command = values["command"]
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(part, str) and part for part in command)
    ):
        raise ServiceError(
            'Give the command as a list of words, e.g. ["python", "serve.py"].',
            field="command",
        )
    port = values["port"]
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ServiceError("The port must be between 1 and 65535.", field="port")
    cpus = values["cpus"]
    if not isinstance(cpus, int) or not 1 <= cpus <= max(1, pool.vcpus_per_node):
        raise ServiceError(
            f"Ask for 1 to {max(1, pool.vcpus_per_node)} CPUs per replica.", field="cpus"
        )
    env = values["env"]
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and ENV_NAME.match(k) and isinstance(v, str) for k, v in env.items()
    ):
        raise ServiceError(
            "Environment variables are NAME: value pairs (letters, digits and _ in names).",
            field="env",
        )
    if len(env) > 200:
        raise ServiceError("At most 200 environment variables.", field="env")
    if "PORT" in env:
        raise ServiceError("PORT is set by the platform; leave it out of env.", field="env")


def _check_secrets(*, tenant: Tenant, user: User | None, values: dict[str, Any]) -> None:
    """The named organisation secrets exist and the user may use them (the same rules as
    a job's, in `tenant_secrets_resolve`); none shadows a variable of `env`."""
    names = tenant_secrets_resolve(tenant=tenant, user=user, project="", names=values["secrets"])
    both = sorted(set(names) & set(values["env"]) | set(names) & {"PORT"})
    if both:
        raise ServiceError(
            f"{', '.join(both)} would be set twice: leave it out of env or of secrets.",
            field="secrets",
        )
    values["secrets"] = list(names)


def _check_scale(min_replicas: Any, max_replicas: Any) -> None:
    for name, value in (("min_replicas", min_replicas), ("max_replicas", max_replicas)):
        if not isinstance(value, int) or value < 0:
            raise ServiceError(f"{name} must be a whole number, 0 or more.", field=name)
    if max_replicas < 1:
        raise ServiceError("max_replicas must be at least 1.", field="max_replicas")
    if min_replicas > max_replicas:
        raise ServiceError("min_replicas can't be more than max_replicas.", field="min_replicas")
    quota = settings.SERVICE_MAX_REPLICAS
    if max_replicas > quota:
        raise ServiceError(
            f"max_replicas is over your organisation's quota of {quota} replicas per service.",
            field="max_replicas",
        )


MAX_SCALE_DOWN_DELAY = 3600


def _check_scale_down_delay(delay: Any) -> None:
    if (
        isinstance(delay, bool)
        or not isinstance(delay, int)
        or not 0 <= delay <= MAX_SCALE_DOWN_DELAY
    ):
        raise ServiceError(
            f"scale_down_delay is a whole number of seconds from 0 to {MAX_SCALE_DOWN_DELAY}.",
            field="scale_down_delay",
        )


def _check_autoscale(metric: Any, target: Any) -> None:
    if metric in ("cpu", "gpu"):
        raise ServiceError(
            f"Scaling on {metric.upper()} utilisation needs a Kubernetes autoscaler, and "
            "services run on this host for now: scale on rps or concurrency (measured by "
            "the console's gateway).",
            field="autoscale_metric",
        )
    if metric not in AutoscaleMetric.values:
        raise ServiceError(
            "The autoscale metric is rps (requests per second per replica) or concurrency "
            "(requests in flight per replica).",
            field="autoscale_metric",
        )
    if (
        isinstance(target, bool)
        or not isinstance(target, int | float)
        or not 0.01 <= target <= 100_000
    ):
        raise ServiceError(
            "The autoscale target is a number of requests per replica, from 0.01 to 100000.",
            field="autoscale_target",
        )


def _check_readiness(path: Any) -> None:
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 200:
        raise ServiceError(
            "The readiness path must start with / (e.g. /healthz).", field="readiness_path"
        )


def _check_auth(auth: Any) -> None:
    if auth not in ServiceAuth.values:
        raise ServiceError("auth is either public or token.", field="auth")


def _check_priority(*, tenant: Tenant, user: User | None, priority: Any) -> None:
    if priority not in Priority.values:
        raise ServiceError(f"priority is one of {', '.join(Priority.values)}.", field="priority")
    priority_allowed_check(tenant=tenant, user=user, priority=priority)


def service_pool(*, tenant: Tenant, region_slug: str) -> NodePool:
    """The pool a new service's replicas run on: a CPU pool on the console's host in the
    region (the only kind that runs services in this release)."""
    region = Region.objects.filter(slug=region_slug, is_active=True).first()
    if region is None:
        raise ServiceError(f"There is no region “{region_slug}”.", field="region")
    pools = NodePool.objects.filter(
        region=region, gpu_type__isnull=True, on_console_host=True, is_active=True
    )
    if pools.exists() and not may_run_on_host(tenant):
        raise ServiceError(HOST_NOT_AVAILABLE, code=ErrorCode.FORBIDDEN, field="region")
    pool = pools_for_tenant(tenant).filter(pk__in=pools.values("pk")).first()
    if pool is None:
        raise ServiceError(
            f"Services can't run in {region.name} yet: they run on this host's CPU pool.",
            field="region",
        )
    return pool


def _revision(service: Service, *, copied_from: ServiceRevision | None = None) -> ServiceRevision:
    number = service.revisions.order_by("-number").values_list("number", flat=True).first() or 0
    revision = ServiceRevision.objects.create(
        service=service,
        number=number + 1,
        image=service.image,
        command=list(service.command),
        env=dict(service.env),
        secrets=list(service.secrets),
        port=service.port,
        cpus=service.cpus,
        copied_from=copied_from,
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
    _check_name(spec.name)
    pool = service_pool(tenant=tenant, region_slug=spec.region)
    values = {
        "image": spec.image,
        "command": spec.command,
        "env": spec.env,
        "secrets": spec.secrets,
        "port": spec.port,
        "cpus": spec.cpus,
    }
    _check_runtime(values, pool)
    _check_secrets(tenant=tenant, user=user, values=values)
    _check_scale(spec.min_replicas, spec.max_replicas)
    _check_readiness(spec.readiness_path)
    _check_auth(spec.auth)
    _check_priority(tenant=tenant, user=user, priority=spec.priority)
    _check_autoscale(spec.autoscale_metric, spec.autoscale_target)
    _check_scale_down_delay(spec.scale_down_delay)
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
    """Change a service. A change of image, command, env, port or CPUs makes a new
    revision (its replicas replace the old ones once ready); scale, autoscaling,
    readiness path, auth and priority change in place."""
    service = _locked(service)
    runtime = {name: changes.get(name, getattr(service, name)) for name in REVISION_FIELDS}
    _check_runtime(runtime, service.pool)
    if any(runtime[name] != getattr(service, name) for name in REVISION_FIELDS):
        # (a new command or image could print the secrets: whoever makes it must be
        # allowed to use them)
        _check_secrets(tenant=service.tenant, user=user, values=runtime)
    min_replicas = changes.get("min_replicas", service.min_replicas)
    max_replicas = changes.get("max_replicas", service.max_replicas)
    _check_scale(min_replicas, max_replicas)
    readiness_path = changes.get("readiness_path", service.readiness_path)
    _check_readiness(readiness_path)
    auth = changes.get("auth", service.auth)
    _check_auth(auth)
    priority = changes.get("priority", service.priority)
    if priority != service.priority:
        _check_priority(tenant=service.tenant, user=user, priority=priority)
    metric = changes.get("autoscale_metric", service.autoscale_metric)
    target = changes.get("autoscale_target", service.autoscale_target)
    _check_autoscale(metric, target)
    scale_down_delay = changes.get("scale_down_delay", service.scale_down_delay)
    _check_scale_down_delay(scale_down_delay)
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
    _check_scale(min_replicas, max_replicas)
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
    _check_secrets(tenant=service.tenant, user=user, values=values)  # (still there, allowed)
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
    """Delete a service; its replicas' processes are stopped after commit."""
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
    service.delete()
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
