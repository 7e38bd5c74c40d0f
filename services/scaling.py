"""What every reconcile pass of a service decides, wherever its replicas run (processes
on the console's host: services.reconcile; pods of a Deployment:
services.kubernetes.reconcile): the wanted count from the gateway's counters, a budget's
pause, drains, the status, cold starts, and the secrets' values and volumes at a
replica's start."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import httpx
from django.conf import settings
from redis.exceptions import RedisError

from console.crypto import decrypt_json
from console.models import Tenant
from console.service_errors import ServiceError
from jobs.extensions import VolumeMount
from jobs.models import TenantSecret
from services import traffic
from services.autoscale import AutoscalePolicy, Decision, Observation, autoscale_decide
from services.models import (
    ReplicaState,
    ScaleWindow,
    Service,
    ServiceReplica,
    ServiceRevision,
    ServiceScaleEvent,
    ServiceStatus,
)
from storage.volumes import read_only_mounts

logger = logging.getLogger(__name__)

# A gateway may still send a request to a replica it chose just before the drain, and it
# adds its requests in flight per replica to the shared counts after each tick (a quarter
# of a second, later if its loop is busy): a replica drained less than this long ago may
# have one that isn't counted yet.
DRAIN_MIN_SECONDS = 3
# A replica whose requests don't end (or whose count was lost) is stopped after this.
# (A constant, not a setting: settings.py is at its size limit.)
DRAIN_TIMEOUT_SECONDS = 120
# Scale events kept per service (the page and API show the latest).
SCALE_EVENTS_KEPT = 200


def answers_ready(*, host: str, port: int, path: str) -> bool:
    """Does the replica answer its readiness path with 2xx or 3xx?"""
    try:
        answer = httpx.get(
            f"http://{host}:{port}{path}",
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


def volume_mounts(service: Service, revision: ServiceRevision) -> list[VolumeMount]:
    """The volumes the revision's replicas mount (read-only); SecretGone's twin, VolumeGone,
    when one is gone (one a replica mounts can't be deleted; an older revision's can)."""
    if not revision.volumes:
        return []
    try:
        return read_only_mounts(
            tenant=service.tenant, region=service.region, mounts=revision.volumes
        )
    except ServiceError as error:
        raise VolumeGone(error.message) from None


class VolumeGone(Exception):
    pass


def in_flight(replicas: list[ServiceReplica]) -> dict[int, int] | None:
    """Requests in flight per replica, as the gateway counted them (None: unknown)."""
    try:
        return traffic.replicas_in_flight(replica_ids=[r.pk for r in replicas])
    except RedisError:
        logger.warning("no request counts from Redis: drains end by their timeout")
        return None


def drain(replicas: list[ServiceReplica], reason: str, now: datetime) -> None:
    """No new requests to these (the gateway routes to READY replicas only)."""
    for replica in replicas:
        replica.state, replica.reason, replica.draining_at = ReplicaState.DRAINING, reason, now
        replica.save(update_fields=["state", "reason", "draining_at"])


def decide(service: Service, *, ready: int, now: datetime) -> Decision | None:
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
    end = traffic.samples_end(now.timestamp())
    try:
        seen = Observation(
            now=now.timestamp(),
            samples=traffic.traffic_samples(
                service_id=service.pk,
                end=end,
                seconds=max(policy.stable_window, policy.panic_window),
            ),
            samples_end=end,
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


def record_cold_start(service: Service, first_ready: ServiceReplica) -> None:
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


def budget_paused(service: Service, now: datetime) -> int:
    """A budget paused the service: it wants no replica (recorded once, with the cause)."""
    if service.desired_replicas:
        ServiceScaleEvent.objects.create(
            service=service, at=now, from_replicas=service.desired_replicas, to_replicas=0,
            window=ScaleWindow.BUDGET, metric=service.autoscale_metric,
            target=service.autoscale_target, stable_value=0, panic_value=0,
        )  # fmt: skip
    service.desired_replicas, service.panic_until, service.scale_down_wanted_since = 0, None, None
    return 0


def status_for(service: Service, *, desired: int, ready: int, live: int) -> tuple[str, str]:
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


def keep_first(replicas: list[ServiceReplica], in_flight: dict[int, int] | None) -> list:
    """Replicas best kept first: ready ones, the busiest, the oldest (so a scale-down
    drains the idle and the newest)."""
    counts = in_flight or {}
    return sorted(
        replicas,
        key=lambda r: (r.state != ReplicaState.READY, -counts.get(r.pk, 0), r.started_at, r.pk),
    )


def drain_finished(
    replica: ServiceReplica, in_flight: dict[int, int] | None, now: datetime
) -> str | None:
    """Why a draining replica may stop now (idle, or its drain timed out), else None."""
    since = (now - (replica.draining_at or now)).total_seconds()
    busy = None if in_flight is None else in_flight.get(replica.pk, 0)
    if since >= DRAIN_TIMEOUT_SECONDS:
        return f"{replica.reason} (drain timed out after {since:.0f} s)"
    if since >= DRAIN_MIN_SECONDS and busy == 0:
        return replica.reason or "scaled down"
    return None
