"""Make a service's replicas match what it asks for.

On a cluster the pass is services.kubernetes.reconcile's (a Deployment's pods); on the
console's host it is the one below, over sandboxed processes. One pass
(`service_reconcile`, run by a Celery task after each write, when the gateway holds a
request at zero, and on beat's schedule) observes every live replica, checks
readiness over HTTP, decides how many replicas the traffic wants (services.autoscale,
from the gateway's counters in services.traffic), starts the missing ones, drains and
stops the ones no longer wanted and sets the service's status:

- a replica whose process ended is marked stopped (a crash counts as a restart; after
  SERVICE_MAX_RESTARTS without a ready replica the service is "failed" and no more start);
- a starting replica becomes ready when `readiness_path` answers 2xx/3xx; a ready one
  that stops answering goes back to starting (the gateway then skips it);
- each change of the wanted count is a `ServiceScaleEvent`; a start from zero records
  how long the first request waited for a ready replica;
- a new revision's replicas start beside the old ones, never more than `max_replicas + 1`
  replicas at once; an old one is drained as soon as enough new ones are ready;
- draining (scaled down, or replaced) means the gateway sends the replica no new request;
  it is stopped once its requests in flight are done, or after the drain timeout;
  one wanted again before that serves again instead of a new one starting;
- stopped rows are removed on the pass after the one that stopped them.

Between passes, beat asks for a decision every second (`service_autoscale`): it only
updates the wanted count, and a changed count starts a pass at once.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from redis.exceptions import RedisError

from jobs.backends import host_processes
from marketplace.models import Backend
from services import scaling, traffic
from services.kubernetes.reconcile import service_pass as kubernetes_pass
from services.models import CLUSTER_METRICS, ReplicaState, Service, ServiceReplica
from services.signals import replicas_removing

logger = logging.getLogger(__name__)

# While requests wait for a first replica, passes follow each other this quickly.
QUICK_PASS_SECONDS = 0.5


def replica_key(replica: ServiceReplica) -> str:
    return f"service-{replica.service_id}-replica-{replica.pk}"


def replica_start(*, service: Service) -> ServiceReplica:
    """Start one replica of the service's current revision."""
    revision = service.current_revision
    assert revision is not None  # every service has one from its creation
    replica = ServiceReplica.objects.create(service=service, revision=revision)
    replica.handle = replica_key(replica)
    try:
        secrets = scaling.secret_values(tenant=service.tenant, names=revision.secrets)
        volumes = scaling.volume_mounts(service, revision)
        process = host_processes.HostProcess(
            key=replica.handle,
            tenant_id=service.tenant_id,
            slot=replica.pk,
            command=list(revision.command),
            env={**{str(k): str(v) for k, v in revision.env.items()}, **secrets},
            port=revision.port,
            cpus=revision.cpus,
            volumes=tuple(volumes),
        )
        replica.host_port = host_processes.host_process_start(process)
    except (
        host_processes.HostProcessError,
        OSError,
        scaling.SecretGone,
        scaling.VolumeGone,
    ) as error:
        replica.state, replica.stopped_at = ReplicaState.STOPPED, replica.started_at
        replica.reason = f"could not start: {error}"[:300]
        service.restarts += 1
    replica.save()
    return replica


def replica_stop(replica: ServiceReplica, reason: str) -> None:
    if replica.handle:
        host_processes.host_stop(replica.handle)
    replica.state, replica.stopped_at = ReplicaState.STOPPED, timezone.now()
    replica.reason = reason[:300]
    replica.save(update_fields=["state", "reason", "stopped_at"])


def replica_discard(handle: str) -> None:
    """Stop a replica's process and remove its files (its row is gone or going)."""
    host_processes.host_discard(handle)


def _observe(
    service: Service, replicas: list[ServiceReplica], now: datetime
) -> tuple[list[ServiceReplica], set[int]]:
    """The replicas still alive, and which of them answer readiness; the others are
    marked stopped."""
    live, answering = [], set()
    for replica in replicas:
        if replica.handle and host_processes.host_running(replica.handle):
            port = replica.host_port
            ready = port is not None and scaling.answers_ready(
                host="127.0.0.1", port=port, path=service.readiness_path
            )
            if ready:
                answering.add(replica.pk)
            if ready and replica.state == ReplicaState.STARTING:
                replica.state, replica.ready_at = ReplicaState.READY, now
                replica.save(update_fields=["state", "ready_at"])
            elif not ready and replica.state == ReplicaState.READY:
                replica.state = ReplicaState.STARTING
                replica.save(update_fields=["state"])
            live.append(replica)
            continue
        reason = host_processes.host_exit_reason(replica.handle) or "its process ended"
        if replica.state != ReplicaState.DRAINING and not service.paused_by_budget:
            service.restarts += 1  # it ended without being asked to
            service.status_reason = f"A replica ended: {reason}"[:300]
        replica.state, replica.reason = ReplicaState.STOPPED, reason[:300]
        replica.stopped_at = now  # seen ended now (it ran, and was billed, until then)
        replica.save(update_fields=["state", "reason", "stopped_at"])
    return live, answering


def _finish_drains(
    draining: list[ServiceReplica], in_flight: dict[int, int] | None, now: datetime
) -> list[ServiceReplica]:
    """Stop the draining replicas that are idle (or past the drain timeout); the ones
    still draining."""
    still = []
    for replica in draining:
        reason = scaling.drain_finished(replica, in_flight, now)
        if reason is None:
            still.append(replica)
        else:
            replica_stop(replica, reason)
    return still


def service_reconcile(*, service_id: int) -> Service | None:
    """One reconcile pass over the service (see the module's docstring)."""
    with transaction.atomic():
        service = Service.objects.select_for_update().filter(pk=service_id).first()
        if service is None:
            return None
        now = timezone.now()
        gone = service.replicas.filter(state=ReplicaState.STOPPED)  # stopped last pass
        forget = list(gone.values_list("pk", flat=True))
        if forget:
            replicas_removing.send(sender=ServiceReplica, replica_ids=forget)
        gone.delete()
        if service.pool.backend == Backend.KUBERNETES:
            kubernetes_pass(service, now)
        else:
            _host_pass(service, now)
        if forget:
            with contextlib.suppress(RedisError):  # (counters of gone replicas: harmless)
                traffic.replicas_forget(replica_ids=forget)
        service.save(
            update_fields=[
                "status",
                "status_reason",
                "restarts",
                "desired_replicas",
                "panic_until",
                "scale_down_wanted_since",
                "updated_at",
            ]
        )
        return service


def _host_pass(service: Service, now: datetime) -> None:
    """The pass over replicas that are processes on the console's host."""
    replicas = list(service.replicas.exclude(state=ReplicaState.STOPPED))
    ready_before = any(r.state == ReplicaState.READY for r in replicas)
    live, answering = _observe(service, replicas, now)
    in_flight = scaling.in_flight(live)
    draining = [r for r in live if r.state == ReplicaState.DRAINING]
    live = [r for r in live if r.state != ReplicaState.DRAINING]
    draining = _finish_drains(draining, in_flight, now)
    current = [r for r in live if r.revision_id == service.current_revision_id]
    older = [r for r in live if r.revision_id != service.current_revision_id]
    ready_now = [r for r in live if r.state == ReplicaState.READY]
    if ready_now and not ready_before:
        scaling.record_cold_start(service, ready_now[0])
    if service.paused_by_budget:
        desired = scaling.budget_paused(service, now)
    elif (decision := scaling.decide(service, ready=len(ready_now), now=now)) is not None:
        desired = decision.desired
    else:  # (within the bounds, which may have changed meanwhile)
        desired = min(max(service.desired_replicas, service.min_replicas), service.max_replicas)
    crash_looping = service.restarts >= settings.SERVICE_MAX_RESTARTS and not any(
        r.state == ReplicaState.READY for r in current
    )
    if not crash_looping:
        # Wanted again before it was stopped: it serves again.
        for replica in [r for r in draining if r.revision_id == service.current_revision_id]:
            if len(current) >= desired:
                break
            answers = replica.pk in answering and replica.ready_at is not None
            replica.state = ReplicaState.READY if answers else ReplicaState.STARTING
            replica.reason, replica.draining_at = "", None
            replica.save(update_fields=["state", "reason", "draining_at"])
            draining.remove(replica)
            current.append(replica)
        # Never more than max_replicas + 1 at once (a rollout's surge), draining included.
        room = service.max_replicas + 1 - len(current) - len(older) - len(draining)
        for _ in range(min(desired - len(current), room)):
            started = replica_start(service=service)
            if started.state != ReplicaState.STOPPED:
                current.append(started)
    surplus = len(current) - desired
    if surplus > 0:
        order = scaling.keep_first(current, in_flight)
        why = "paused: its budget is used up" if service.paused_by_budget else "scaled down"
        scaling.drain(order[desired:], why, now)
        current = order[:desired]
    ready = sum(r.state == ReplicaState.READY for r in current)
    # An old revision's replica goes as soon as the new ones can do without it.
    keep_old = scaling.keep_first(older, in_flight)[: max(0, desired - ready)]
    scaling.drain([r for r in older if r not in keep_old], "replaced by a newer revision", now)
    service.status, service.status_reason = scaling.status_for(
        service, desired=desired, ready=ready, live=len(live) + len(draining)
    )


def quick_pass_wanted(service: Service) -> bool:
    """Requests wait while a replica starts: the next pass should come at once (in
    QUICK_PASS_SECONDS), not on beat's schedule, so they are served as soon as it is
    ready. (On a cluster the pod may not even be listed yet: no ready replica is enough.)"""
    if not service.desired_replicas or service.replicas.filter(state=ReplicaState.READY).exists():
        return False
    try:
        return traffic.held_counts(service_ids=[service.pk])[service.pk] > 0
    except RedisError:
        return False


def service_autoscale(*, service_id: int) -> bool:
    """One autoscaling decision between reconcile passes (beat asks every second), from
    the gateway's counters: True when the wanted count changed, so that a reconcile pass
    acts on it now. A service a pass holds is left to that pass, which decides too."""
    with transaction.atomic():
        service = (
            Service.objects.select_for_update(skip_locked=True)
            .filter(pk=service_id, paused_by_budget=False)
            .exclude(autoscale_metric__in=CLUSTER_METRICS)  # (the cluster's HPA decides)
            .first()
        )
        if service is None:
            return False
        before = (service.desired_replicas, service.panic_until, service.scale_down_wanted_since)
        ready = service.replicas.filter(state=ReplicaState.READY).count()
        if scaling.decide(service, ready=ready, now=timezone.now()) is None:
            return False
        after = (service.desired_replicas, service.panic_until, service.scale_down_wanted_since)
        if after == before:
            return False
        service.save(
            update_fields=[
                "desired_replicas",
                "panic_until",
                "scale_down_wanted_since",
                "updated_at",
            ]
        )
        return after[0] != before[0]


def services_autoscale_all() -> list[int]:
    """A decision for every service that runs replicas (one at zero wakes when a request
    arrives); the ids of those whose wanted count changed."""
    wanting = (
        Service.objects.filter(paused_by_budget=False)
        .exclude(autoscale_metric__in=CLUSTER_METRICS)
        .filter(Q(min_replicas__gt=0) | Q(desired_replicas__gt=0))
    )
    changed = []
    for service_id in wanting.order_by("pk").values_list("pk", flat=True):
        try:
            if service_autoscale(service_id=service_id):
                changed.append(service_id)
        except Exception:  # one broken service must not stop the others' decisions
            logger.exception("autoscaling service %s failed", service_id)
    return changed


def services_reconcile_all() -> int:
    """Reconcile every service that wants replicas, still has some, or has requests
    waiting for one; returns how many."""
    wanting = Service.objects.filter(min_replicas__gt=0) | Service.objects.filter(
        desired_replicas__gt=0
    )
    ids = set(wanting.values_list("pk", flat=True))
    ids |= set(ServiceReplica.objects.values_list("service_id", flat=True).distinct())
    at_zero = Service.objects.exclude(pk__in=ids).values_list("pk", flat=True)
    try:
        ids |= {i for i, held in traffic.held_counts(service_ids=at_zero).items() if held}
    except RedisError:
        logger.warning("no held-request counts from Redis; services at zero wait for them")
    for service_id in sorted(ids):
        try:
            service_reconcile(service_id=service_id)
        except Exception:  # one broken service must not stop the others' pass
            logger.exception("reconcile of service %s failed", service_id)
    return len(ids)
