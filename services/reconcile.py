"""Make a service's replicas match what it asks for.

One pass (`service_reconcile`, run by a Celery task after each write, when the gateway
holds a request at zero, and on beat's schedule) observes every live replica, checks
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
  it is stopped once its requests in flight are done, or after DRAIN_TIMEOUT_SECONDS;
  one wanted again before that serves again instead of a new one starting;
- stopped rows are removed on the pass after the one that stopped them.

Between passes, beat asks for a decision every second (`service_autoscale`): it only
updates the wanted count, and a changed count starts a pass at once.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from redis.exceptions import RedisError

from console.crypto import decrypt_json
from console.models import Tenant
from jobs.backends import host_processes
from jobs.models import TenantSecret
from services import traffic
from services.autoscale import AutoscalePolicy, Decision, Observation, autoscale_decide
from services.models import (
    ReplicaState,
    ScaleWindow,
    Service,
    ServiceReplica,
    ServiceScaleEvent,
    ServiceStatus,
)
from services.signals import replicas_removing

logger = logging.getLogger(__name__)

# A gateway may still send a request to a replica it chose just before the drain, and it
# adds its requests in flight per replica to the shared counts once a second: a replica
# drained less than this long ago may have one that isn't counted yet.
DRAIN_MIN_SECONDS = 3
# A replica whose requests don't end (or whose count was lost) is stopped after this.
# (A constant, not a setting: settings.py is at its size limit.)
DRAIN_TIMEOUT_SECONDS = 120
# While requests wait for a first replica, passes follow each other this quickly.
QUICK_PASS_SECONDS = 0.5
# Scale events kept per service (the page and API show the latest).
SCALE_EVENTS_KEPT = 200


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


class SecretGone(Exception):
    pass


def secret_values(*, tenant: Tenant, names: list[str]) -> dict[str, str]:
    """The current values of the organisation secrets a revision names (whoever wrote the
    revision was allowed them; a secret changed since applies to replicas started after)."""
    if not names:
        return {}
    found = {
        secret.name: decrypt_json(secret.value_encrypted)["value"]
        for secret in TenantSecret.objects.for_tenant(tenant).filter(name__in=names)
    }
    missing = sorted(set(names) - set(found))
    if missing:
        raise SecretGone(f"the organisation secret {', '.join(missing)} no longer exists")
    return found


def replica_start(*, service: Service) -> ServiceReplica:
    """Start one replica of the service's current revision."""
    revision = service.current_revision
    assert revision is not None  # every service has one from its creation
    replica = ServiceReplica.objects.create(service=service, revision=revision)
    replica.handle = replica_key(replica)
    try:
        secrets = secret_values(tenant=service.tenant, names=revision.secrets)
        process = host_processes.HostProcess(
            key=replica.handle,
            tenant_id=service.tenant_id,
            slot=replica.pk,
            command=list(revision.command),
            env={**{str(k): str(v) for k, v in revision.env.items()}, **secrets},
            port=revision.port,
            cpus=revision.cpus,
        )
        replica.host_port = host_processes.host_process_start(process)
    except (host_processes.HostProcessError, OSError, SecretGone) as error:
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
            ready = replica_ready(replica=replica, readiness_path=service.readiness_path)
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


def _in_flight(replicas: list[ServiceReplica]) -> dict[int, int] | None:
    """Requests in flight per replica, as the gateway counted them (None: unknown)."""
    try:
        return traffic.replicas_in_flight(replica_ids=[r.pk for r in replicas])
    except RedisError:
        logger.warning("no request counts from Redis: drains end by their timeout")
        return None


def _drain(replicas: list[ServiceReplica], reason: str, now: datetime) -> None:
    """No new requests to these (the gateway routes to READY replicas only)."""
    for replica in replicas:
        replica.state, replica.reason, replica.draining_at = ReplicaState.DRAINING, reason, now
        replica.save(update_fields=["state", "reason", "draining_at"])


def _finish_drains(
    draining: list[ServiceReplica], in_flight: dict[int, int] | None, now: datetime
) -> list[ServiceReplica]:
    """Stop the draining replicas that are idle (or past the drain timeout); the ones
    still draining."""
    still = []
    for replica in draining:
        since = (now - (replica.draining_at or now)).total_seconds()
        busy = None if in_flight is None else in_flight.get(replica.pk, 0)
        if since >= DRAIN_TIMEOUT_SECONDS:
            replica_stop(replica, f"{replica.reason} (drain timed out after {since:.0f} s)")
        elif since >= DRAIN_MIN_SECONDS and busy == 0:
            replica_stop(replica, replica.reason or "scaled down")
        else:
            still.append(replica)
    return still


def _decide(service: Service, *, ready: int, now: datetime) -> Decision | None:
    """The autoscaler's decision from the gateway's counters (None if Redis can't say:
    the service then keeps its count rather than act on no data)."""
    policy = AutoscalePolicy(
        metric=service.autoscale_metric,
        target=service.autoscale_target,
        min_replicas=service.min_replicas,
        max_replicas=service.max_replicas,
        stable_window=settings.SERVICE_AUTOSCALE_STABLE_WINDOW,
        panic_window=settings.SERVICE_AUTOSCALE_PANIC_WINDOW,
        scale_to_zero_grace=settings.SERVICE_SCALE_TO_ZERO_GRACE,
        scale_down_delay=service.scale_down_delay,
    )
    try:
        seen = Observation(
            now=now.timestamp(),
            samples=traffic.traffic_samples(
                service_id=service.pk,
                now=now.timestamp(),
                seconds=max(policy.stable_window, policy.panic_window),
            ),
            ready=ready,
            previous=service.desired_replicas,
            held=traffic.held_counts(service_ids=[service.pk])[service.pk],
            last_request_at=traffic.last_request_at(service_id=service.pk),
            panic_until=service.panic_until.timestamp() if service.panic_until else None,
            lower_since=(
                service.scale_down_wanted_since.timestamp()
                if service.scale_down_wanted_since
                else None
            ),
        )
    except RedisError:
        logger.warning("no traffic counts from Redis: service %s keeps its count", service.pk)
        return None
    decision = autoscale_decide(policy, seen)
    if decision.desired != service.desired_replicas:
        ServiceScaleEvent.objects.create(
            service=service,
            at=now,
            from_replicas=service.desired_replicas,
            to_replicas=decision.desired,
            window=decision.window,
            metric=policy.metric,
            target=policy.target,
            stable_value=decision.stable_value,
            panic_value=decision.panic_value,
            held_requests=seen.held,
        )
        stale = service.scale_events.order_by("-at", "-pk").values("pk")[SCALE_EVENTS_KEPT:]
        ServiceScaleEvent.objects.filter(pk__in=list(stale)).delete()
    service.desired_replicas = decision.desired
    service.panic_until = (
        datetime.fromtimestamp(decision.panic_until, tz=UTC) if decision.panic_until else None
    )
    service.scale_down_wanted_since = (
        datetime.fromtimestamp(decision.lower_since, tz=UTC) if decision.lower_since else None
    )
    return decision


def _record_cold_start(service: Service, first_ready: ServiceReplica) -> None:
    """The first replica is ready after a wait at zero: how long the first held request
    waited for it goes on the decision that started it."""
    try:
        since = traffic.waiting_since(service_id=service.pk)
        traffic.waiting_recorded(service_id=service.pk)
    except RedisError:
        return
    if since is None or first_ready.ready_at is None:
        return
    event = (
        service.scale_events.filter(window=ScaleWindow.COLD_START, cold_start_seconds=None)
        .order_by("-at", "-pk")
        .first()
    )
    if event is not None:
        waited = first_ready.ready_at.timestamp() - min(since, event.at.timestamp())
        event.cold_start_seconds = round(max(0.0, waited), 3)
        event.save(update_fields=["cold_start_seconds"])


def _budget_paused(service: Service, now: datetime) -> int:
    """A budget paused the service: it wants no replica (recorded once, with the cause)."""
    if service.desired_replicas:
        ServiceScaleEvent.objects.create(
            service=service, at=now, from_replicas=service.desired_replicas, to_replicas=0,
            window=ScaleWindow.BUDGET, metric=service.autoscale_metric,
            target=service.autoscale_target, stable_value=0, panic_value=0,
        )  # fmt: skip
    service.desired_replicas, service.panic_until, service.scale_down_wanted_since = 0, None, None
    return 0


def _status(service: Service, *, desired: int, ready: int, live: int) -> tuple[str, str]:
    if service.paused_by_budget:
        return ServiceStatus.PAUSED, service.status_reason
    if service.restarts >= settings.SERVICE_MAX_RESTARTS and ready == 0 and desired:
        return ServiceStatus.FAILED, service.status_reason or "Its replicas keep ending."
    if desired == 0:
        return (ServiceStatus.SCALED_TO_ZERO, "") if live == 0 else (ServiceStatus.DEPLOYING, "")
    if ready >= desired:
        return ServiceStatus.READY, ""
    if ready:
        return ServiceStatus.DEGRADED, f"{ready} of {desired} replicas ready."
    return ServiceStatus.DEPLOYING, ""


def _keep_first(replicas: list[ServiceReplica], in_flight: dict[int, int] | None) -> list:
    """Replicas best kept first: ready ones, the busiest, the oldest (so a scale-down
    drains the idle and the newest)."""
    counts = in_flight or {}
    return sorted(
        replicas,
        key=lambda r: (r.state != ReplicaState.READY, -counts.get(r.pk, 0), r.started_at, r.pk),
    )


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
        replicas = list(service.replicas.exclude(state=ReplicaState.STOPPED))
        ready_before = any(r.state == ReplicaState.READY for r in replicas)
        live, answering = _observe(service, replicas, now)
        in_flight = _in_flight(live)
        draining = [r for r in live if r.state == ReplicaState.DRAINING]
        live = [r for r in live if r.state != ReplicaState.DRAINING]
        draining = _finish_drains(draining, in_flight, now)
        current = [r for r in live if r.revision_id == service.current_revision_id]
        older = [r for r in live if r.revision_id != service.current_revision_id]
        ready_now = [r for r in live if r.state == ReplicaState.READY]
        if ready_now and not ready_before:
            _record_cold_start(service, ready_now[0])
        if service.paused_by_budget:
            desired = _budget_paused(service, now)
        elif (decision := _decide(service, ready=len(ready_now), now=now)) is not None:
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
            order = _keep_first(current, in_flight)
            why = "paused: its budget is used up" if service.paused_by_budget else "scaled down"
            _drain(order[desired:], why, now)
            current = order[:desired]
        ready = sum(r.state == ReplicaState.READY for r in current)
        # An old revision's replica goes as soon as the new ones can do without it.
        keep_old = _keep_first(older, in_flight)[: max(0, desired - ready)]
        _drain([r for r in older if r not in keep_old], "replaced by a newer revision", now)
        if forget:
            with contextlib.suppress(RedisError):  # (counters of gone replicas: harmless)
                traffic.replicas_forget(replica_ids=forget)
        service.status, service.status_reason = _status(
            service, desired=desired, ready=ready, live=len(live) + len(draining)
        )
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


def quick_pass_wanted(service: Service) -> bool:
    """Requests wait while a replica starts: the next pass should come at once (in
    QUICK_PASS_SECONDS), not on beat's schedule, so they are served as soon as it is
    ready."""
    if not service.replicas.filter(
        state=ReplicaState.STARTING, revision_id=service.current_revision_id
    ).exists():
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
            .first()
        )
        if service is None:
            return False
        before = (service.desired_replicas, service.panic_until, service.scale_down_wanted_since)
        ready = service.replicas.filter(state=ReplicaState.READY).count()
        if _decide(service, ready=ready, now=timezone.now()) is None:
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
    wanting = Service.objects.filter(paused_by_budget=False).filter(
        Q(min_replicas__gt=0) | Q(desired_replicas__gt=0)
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
