"""Make a service's replicas match what it asks for.

One pass (`service_reconcile`, run by a Celery task after each write and on beat's
schedule) observes every live replica, checks readiness over HTTP, starts the missing
ones, drains and stops the ones no longer wanted and sets the service's status:

- a replica whose process ended is marked stopped (a crash counts as a restart; after
  SERVICE_MAX_RESTARTS without a ready replica the service is "failed" and no more start);
- a starting replica becomes ready when `readiness_path` answers 2xx/3xx; a ready one
  that stops answering goes back to starting (the gateway then skips it);
- a new revision's replicas start beside the old ones; the old ones are drained (the
  gateway stops sending them requests) once as many new ones are ready as wanted, and
  stopped on the next pass, so requests in flight may finish;
- stopped rows are removed on the pass after the one that stopped them.
"""

from __future__ import annotations

import logging

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.backends import host_processes
from services.models import ReplicaState, Service, ServiceReplica, ServiceStatus

logger = logging.getLogger(__name__)


def replica_key(replica: ServiceReplica) -> str:
    return f"service-{replica.service_id}-replica-{replica.pk}"


def replica_ready(*, replica: ServiceReplica, readiness_path: str) -> bool:
    """Does the replica answer its readiness path with 2xx or 3xx?"""
    if not replica.host_port:
        return False
    try:
        answer = httpx.get(
            f"http://127.0.0.1:{replica.host_port}{readiness_path}",
            timeout=settings.SERVICE_READINESS_TIMEOUT,
            follow_redirects=False,
        )
    except httpx.HTTPError:
        return False
    return 200 <= answer.status_code < 400


def replica_start(*, service: Service) -> ServiceReplica:
    """Start one replica of the service's current revision."""
    revision = service.current_revision
    assert revision is not None  # every service has one from its creation
    replica = ServiceReplica.objects.create(service=service, revision=revision)
    replica.handle = replica_key(replica)
    process = host_processes.HostProcess(
        key=replica.handle,
        tenant_id=service.tenant_id,
        slot=replica.pk,
        command=list(revision.command),
        env={str(k): str(v) for k, v in revision.env.items()},
        port=revision.port,
        cpus=revision.cpus,
    )
    try:
        replica.host_port = host_processes.host_process_start(process)
    except (host_processes.HostProcessError, OSError) as error:
        replica.state = ReplicaState.STOPPED
        replica.reason = f"could not start: {error}"[:300]
        service.restarts += 1
    replica.save()
    return replica


def replica_stop(replica: ServiceReplica, reason: str) -> None:
    if replica.handle:
        host_processes.host_stop(replica.handle)
    replica.state = ReplicaState.STOPPED
    replica.reason = reason[:300]
    replica.save(update_fields=["state", "reason"])


def replica_discard(handle: str) -> None:
    """Stop a replica's process and remove its files (its row is gone or going)."""
    host_processes.host_discard(handle)


def _observe(service: Service, replicas: list[ServiceReplica]) -> list[ServiceReplica]:
    """The replicas still alive; the others are marked stopped."""
    live = []
    now = timezone.now()
    for replica in replicas:
        if replica.handle and host_processes.host_running(replica.handle):
            ready = replica_ready(replica=replica, readiness_path=service.readiness_path)
            if ready and replica.state == ReplicaState.STARTING:
                replica.state, replica.ready_at = ReplicaState.READY, now
                replica.save(update_fields=["state", "ready_at"])
            elif not ready and replica.state == ReplicaState.READY:
                replica.state = ReplicaState.STARTING
                replica.save(update_fields=["state"])
            live.append(replica)
            continue
        reason = host_processes.host_exit_reason(replica.handle) or "its process ended"
        if replica.state != ReplicaState.DRAINING:
            service.restarts += 1  # it ended without being asked to
            service.status_reason = f"A replica ended: {reason}"[:300]
        replica.state, replica.reason = ReplicaState.STOPPED, reason[:300]
        replica.save(update_fields=["state", "reason"])
    return live


def _drain_or_stop(replicas: list[ServiceReplica], reason: str) -> None:
    """First pass: draining (no new requests); next pass: stopped."""
    for replica in replicas:
        if replica.state == ReplicaState.DRAINING:
            replica_stop(replica, reason)
        else:
            replica.state = ReplicaState.DRAINING
            replica.reason = reason
            replica.save(update_fields=["state", "reason"])


def _status(service: Service, *, desired: int, ready: int, live: int) -> tuple[str, str]:
    if service.restarts >= settings.SERVICE_MAX_RESTARTS and ready == 0 and desired:
        return ServiceStatus.FAILED, service.status_reason or "Its replicas keep ending."
    if desired == 0:
        return (ServiceStatus.SCALED_TO_ZERO, "") if live == 0 else (ServiceStatus.DEPLOYING, "")
    if ready >= desired:
        return ServiceStatus.READY, ""
    if ready:
        return ServiceStatus.DEGRADED, f"{ready} of {desired} replicas ready."
    return ServiceStatus.DEPLOYING, ""


def service_reconcile(*, service_id: int) -> Service | None:
    """One reconcile pass over the service (see the module's docstring)."""
    with transaction.atomic():
        service = Service.objects.select_for_update().filter(pk=service_id).first()
        if service is None:
            return None
        service.replicas.filter(state=ReplicaState.STOPPED).delete()  # stopped last pass
        replicas = list(service.replicas.exclude(state=ReplicaState.STOPPED))
        live = _observe(service, replicas)
        desired = min(service.min_replicas, service.max_replicas)
        current = [r for r in live if r.revision_id == service.current_revision_id]
        older = [r for r in live if r.revision_id != service.current_revision_id]
        crash_looping = service.restarts >= settings.SERVICE_MAX_RESTARTS and not any(
            r.state == ReplicaState.READY for r in current
        )
        serving = [r for r in current if r.state != ReplicaState.DRAINING]
        # Drained on an earlier pass: their requests in flight had a pass to finish.
        for replica in current:
            if replica.state == ReplicaState.DRAINING:
                replica_stop(replica, replica.reason or "scaled down")
        if not crash_looping:
            for _ in range(desired - len(serving)):
                started = replica_start(service=service)
                if started.state != ReplicaState.STOPPED:
                    serving.append(started)
        # Too many (scaled down): the ones not ready first, then the newest.
        surplus = len(serving) - desired
        if surplus > 0:
            order = sorted(serving, key=lambda r: (r.state == ReplicaState.READY, r.started_at))
            _drain_or_stop(order[:surplus], "scaled down")
            serving = order[surplus:]
        ready = sum(r.state == ReplicaState.READY for r in serving)
        if ready >= desired:  # the new revision serves: the old one goes
            _drain_or_stop(older, "replaced by a newer revision")
        service.status, service.status_reason = _status(
            service, desired=desired, ready=ready, live=len(serving) + len(older)
        )
        service.save(update_fields=["status", "status_reason", "restarts", "updated_at"])
        return service


def services_reconcile_all() -> int:
    """Reconcile every service that wants replicas or still has some; returns how many."""
    ids = set(Service.objects.filter(min_replicas__gt=0).values_list("pk", flat=True))
    ids |= set(ServiceReplica.objects.values_list("service_id", flat=True).distinct())
    for service_id in sorted(ids):
        try:
            service_reconcile(service_id=service_id)
        except Exception:  # one broken service must not stop the others' pass
            logger.exception("reconcile of service %s failed", service_id)
    return len(ids)
