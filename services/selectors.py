"""Reads of services: lists with replica counts, revisions, tokens, and what the gateway
needs to route one request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.db.models import Count, Q, QuerySet

from console.caching import akept, cached, forget, kept
from console.models import Tenant, sha256_hex
from marketplace.models import Backend, GpuType, NodePool
from services.models import (
    ReplicaState,
    Service,
    ServiceAuth,
    ServiceReplica,
    ServiceRevision,
    ServiceScaleEvent,
    ServiceToken,
)
from storage.models import Volume


def services_with_counts(queryset: QuerySet[Service]) -> QuerySet[Service]:
    """`ready_replicas` (serving) and `replica_count` (not stopped) on each row."""
    return (
        queryset.select_related("current_revision", "region", "pool", "tenant", "gpu_type")
        .annotate(
            ready_replicas=Count("replicas", filter=Q(replicas__state=ReplicaState.READY)),
            replica_count=Count("replicas", filter=~Q(replicas__state=ReplicaState.STOPPED)),
        )
        .order_by("name", "pk")
    )  # (Meta.ordering does not apply to an aggregate query)


def services_for_tenant(*, tenant: Tenant | None) -> QuerySet[Service]:
    return services_with_counts(Service.objects.for_tenant(tenant))


def service_revisions(*, service: Service) -> QuerySet[ServiceRevision]:
    return service.revisions.select_related("copied_from").order_by("-number")


def service_tokens(*, service: Service) -> QuerySet[ServiceToken]:
    return service.tokens.order_by("-created_at")


def service_replicas(*, service: Service) -> QuerySet[ServiceReplica]:
    return service.replicas.select_related("revision").order_by("started_at", "pk")


def service_scale_events(*, service: Service, limit: int = 50) -> QuerySet[ServiceScaleEvent]:
    """The latest changes of the wanted replica count, newest first."""
    return service.scale_events.order_by("-at", "-pk")[:limit]


def services_mounting(*, volume: Volume) -> list[Service]:
    """The organisation's services whose running revision, or a revision whose replicas
    still run (a rollout), mounts `volume` (by name; read in Python: SQLite has no JSON
    containment)."""
    services = Service.objects.for_tenant(volume.tenant).filter(region_id=volume.region_id)
    live = ServiceReplica.objects.exclude(state=ReplicaState.STOPPED).values("revision_id")
    revisions = ServiceRevision.objects.filter(service__in=services).filter(
        Q(pk__in=live) | Q(pk__in=services.values("current_revision_id"))
    )
    ids = {
        revision.service_id
        for revision in revisions.only("service_id", "volumes")
        if any(mount.get("name") == volume.name for mount in revision.volumes)
    }
    return list(services.filter(pk__in=ids).order_by("name"))


def gpu_types_for_services() -> QuerySet[GpuType]:
    """GPU types some active pool of a Kubernetes cluster offers (where GPU replicas run)."""
    pools = NodePool.objects.filter(
        is_active=True, backend=Backend.KUBERNETES, on_console_host=False
    )
    return GpuType.objects.filter(is_active=True, pk__in=pools.values("gpu_type_id"))


def endpoint_path(service: Service) -> str:
    return f"/svc/{service.tenant.slug}/{service.name}/"


class Upstream(NamedTuple):
    """A ready replica as the gateway reaches it."""

    replica_id: int
    host: str  # the console's loopback, or a pod's IP
    port: int
    revision: int  # its revision's number


@dataclass(frozen=True)
class Route:
    """What the gateway needs of one service: its id, whether a token is needed, its
    status, and each ready replica."""

    service_id: int
    address: tuple[str, str]  # (organisation slug, service name)
    auth: str
    status: str
    replicas: list[Upstream]
    status_reason: str = ""


# What the gateway reads on every request is kept in Django's cache (console.caching) and
# dropped when it changes (services.receivers): a service, its replicas and its tokens.
# So a request costs no query while nothing changes, and a revoked token, a drained
# replica or a budget's pause counts from the write's commit on. The timeout bounds what
# a drop that Redis missed can keep.
ROUTE_KEPT_SECONDS = 60


def route_key(service_id: int) -> str:
    return f"service-route:{service_id}"


def token_key(service_id: int, key_hash: str) -> str:
    return f"service-token:{service_id}:{key_hash}"


# This process's (organisation slug, service name) → service id, found once: an id never
# changes, and a route that is gone sends the lookup back to the database.
_route_ids: dict[tuple[str, str], int] = {}


class _AccessQuery(NamedTuple):
    """What one gateway request asks: a service by its address, with a token."""

    address: tuple[str, str]  # (organisation slug, service name)
    known: int | None  # the service id this process found for the address before
    key_hash: str  # the token's hash ("": not a service token)

    @classmethod
    def of(cls, *, tenant_slug: str, name: str, token: str) -> _AccessQuery:
        key_hash = sha256_hex(token) if token.startswith(ServiceToken.PREFIX) else ""
        return cls((tenant_slug, name), _route_ids.get((tenant_slug, name)), key_hash)

    def keys(self) -> list[str]:
        """The route's and the token's keys: one read of the cache (none for an address
        this process hasn't met)."""
        if self.known is None:
            return []
        keys = [route_key(self.known)]
        if self.key_hash:
            keys.append(token_key(self.known, self.key_hash))
        return keys


def gateway_access(*, tenant_slug: str, name: str, token: str) -> tuple[Route | None, bool]:
    """The route of the service `name` of the tenant `tenant_slug` (None: unknown either
    way) and whether `token` opens it. While nothing changes, the route and the token's
    check are one read of the cache: a request's only round trip before the replica."""
    query = _AccessQuery.of(tenant_slug=tenant_slug, name=name, token=token)
    keys = query.keys()
    found = kept(keys) if keys else {}
    return _access_kept(query, found) or _access_read(query, found)


async def agateway_access(*, tenant_slug: str, name: str, token: str) -> tuple[Route | None, bool]:
    """`gateway_access` on the event loop: while the cache decides, the request waits for
    no worker thread (under load, waiting for one was most of the gateway's overhead);
    a read from the database runs in one."""
    query = _AccessQuery.of(tenant_slug=tenant_slug, name=name, token=token)
    found = await akept(query.keys())  # (no keys: no round trip)
    decided = _access_kept(query, found)
    if decided is not None:
        return decided
    return await sync_to_async(_access_read_apart, thread_sensitive=False)(query, found)


def _access_kept(query: _AccessQuery, found: dict[str, object]) -> tuple[Route, bool] | None:
    """The answer when what the cache returned (`found`) decides it, else None."""
    route = _kept_route(query, found)
    if route is None:
        return None
    allowed = _allowed(route, query.key_hash, found)
    return None if allowed is None else (route, allowed)


def _access_read(query: _AccessQuery, found: dict[str, object]) -> tuple[Route | None, bool]:
    """The answer, read from the database where the cache doesn't tell it."""
    tenant_slug, name = query.address
    route = _kept_route(query, found) or gateway_route(tenant_slug=tenant_slug, name=name)
    if route is None:
        return None, False
    allowed = _allowed(route, query.key_hash, found)
    if allowed is None:
        allowed = _token_active(service_id=route.service_id, key_hash=query.key_hash)
    return route, allowed


def _access_read_apart(query: _AccessQuery, found: dict[str, object]) -> tuple[Route | None, bool]:
    close_old_connections()  # a thread outside Django's request cycle: as request_started does
    return _access_read(query, found)


def _kept_route(query: _AccessQuery, found: dict[str, object]) -> Route | None:
    route = found.get(route_key(query.known)) if query.known is not None else None
    return route if isinstance(route, Route) and route.address == query.address else None


def _allowed(route: Route, key_hash: str, found: dict[str, object]) -> bool | None:
    """Whether the token (by its hash) opens `route`; None when only the database can
    tell (a token not kept: a refusal never is)."""
    if not needs_token(route):
        return True
    if not key_hash:
        return False
    if found.get(token_key(route.service_id, key_hash)):
        return True
    return None


def gateway_route(*, tenant_slug: str, name: str) -> Route | None:
    """The service `name` of the tenant `tenant_slug`, or None (unknown either way: the
    gateway never tells another tenant's service from a missing one)."""
    known = _route_ids.get((tenant_slug, name))
    if known is not None:
        route = cached(route_key(known), ROUTE_KEPT_SECONDS, lambda: _route(known))
        if route is not None and route.address == (tenant_slug, name):
            return route
        _route_ids.pop((tenant_slug, name), None)  # deleted (a new one may have its name)
    service_id = (
        Service.objects.filter(tenant__slug=tenant_slug, name=name)
        .values_list("pk", flat=True)
        .first()
    )
    if service_id is None:
        return None
    _route_ids[(tenant_slug, name)] = service_id
    route = cached(route_key(service_id), ROUTE_KEPT_SECONDS, lambda: _route(service_id))
    return route if route is not None and route.address == (tenant_slug, name) else None


def _route(service_id: int) -> Route | None:
    service = (
        Service.objects.filter(pk=service_id, tenant__is_active=True)
        .values("pk", "tenant__slug", "name", "auth", "status", "status_reason")
        .first()
    )
    if service is None:
        return None
    return Route(
        service_id=service["pk"],
        address=(service["tenant__slug"], service["name"]),
        auth=service["auth"],
        status=service["status"],
        replicas=ready_replicas(service_id=service["pk"]),
        status_reason=service["status_reason"],
    )


def ready_replicas(*, service_id: int) -> list[Upstream]:
    """The service's ready replicas."""
    return [
        Upstream(replica_id, host or "127.0.0.1", port, revision)
        for replica_id, host, port, revision in ServiceReplica.objects.filter(
            service_id=service_id, state=ReplicaState.READY, host_port__isnull=False
        )
        .order_by("pk")
        .values_list("pk", "host", "host_port", "revision__number")
        if port is not None
    ]


def _token_active(*, service_id: int, key_hash: str) -> bool:
    return bool(
        cached(
            token_key(service_id, key_hash),
            ROUTE_KEPT_SECONDS,
            lambda: (
                ServiceToken.objects.active()
                .filter(service_id=service_id, key_hash=key_hash)
                .exists()
                or None
            ),  # (a refusal is not kept: a token created now works at once)
        )
    )


def routes_forget(*, service_ids: list[int]) -> None:
    """What the gateway keeps of these services changed (or may have)."""
    forget(route_key(service_id) for service_id in service_ids)


def token_forget(*, service_id: int, key_hash: str) -> None:
    forget([token_key(service_id, key_hash)])


def needs_token(route: Route) -> bool:
    return route.auth == ServiceAuth.TOKEN
