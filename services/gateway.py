"""The services gateway: `/svc/<tenant-slug>/<service>/…` in the console's ASGI app.

A plain ASGI app in front of Django (console/asgi.py mounts it): Django's request cycle
buffers nothing we need and would hold a worker thread for a streamed answer, so requests
here go straight to a replica through httpx's async transport (its connection pool,
without the client's cookie jar: a client would keep one replica's cookies and send them
with anyone's later requests, to any replica on that host). Request and response bodies are
streamed chunk by chunk (never read whole). Replicas are taken round-robin among the READY
ones; an idempotent request whose replica refuses the connection (or drops it before any
answer, having read none of its body) is tried once more on another replica. Services
with `auth: token` need `Authorization: Bearer <service token>` (the header is not passed
on). An unknown tenant or service, and another tenant's service, are the same 404.

The gateway feeds the autoscaler (services.traffic): each process tallies its requests
and requests in flight per service and per replica and adds them to Redis after each
tick, a quarter of a second (a draining replica stops once idle). What it needs to
route a request (the service, its ready replicas, whether a token is valid) comes from
Django's cache, dropped when any of it changes (services.selectors), so a request makes
no query, and waits for no worker thread, while nothing does.
When no replica is ready (a service at zero, or still starting), a request is held, up to
SERVICE_COLD_START_QUEUE per service, while the first held one wakes the service (its
reconcile runs at once and starts a replica); the held requests go on as soon as one is
ready, and get a 504 only after SERVICE_COLD_START_TIMEOUT. A service a used-up budget
paused answers 402 with the budget's reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from redis.exceptions import RedisError

from services import selectors, services, traffic
from services.models import ServiceStatus
from services.prometheus import GatewayRequest

logger = logging.getLogger(__name__)

PREFIX = "/svc/"
IDEMPOTENT = {"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"}
# Connection-level headers, never forwarded either way (RFC 9110 §7.6.1).
HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"host",
}

# How often a held request's process looks for a ready replica (one look per service).
READY_POLL_SECONDS = 0.2

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


def split_path(path: str) -> tuple[str, str, str] | None:
    """(tenant slug, service name, path on the replica) of a gateway path, or None."""
    parts = path[len(PREFIX) :].split("/", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        return None
    rest = "/" + (parts[2] if len(parts) == 3 else "")
    return parts[0], parts[1], rest


def _bearer(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, raw = value.decode("latin-1").partition(" ")
            return raw.strip() if scheme.lower() == "bearer" else ""
    return ""


def _ready_replicas(service_id: int) -> list[selectors.Upstream]:
    close_old_connections()
    return selectors.ready_replicas(service_id=service_id)


async def _counted(function: Callable[..., Any], default: Any, **kwargs: Any) -> Any:
    """Call a traffic counter in a worker thread. Redis failing costs the count (the
    autoscaler and drains have fallbacks), never the request."""
    try:
        return await sync_to_async(function, thread_sensitive=False)(**kwargs)
    except RedisError as error:
        logger.warning("traffic counter %s failed: %s", function.__name__, error)
        return default


@dataclasses.dataclass
class LoopState:
    """What the gateway keeps per event loop (its connections and tasks belong to it)."""

    transport: httpx.AsyncHTTPTransport
    tally: traffic.TrafficTally
    recorder: asyncio.Task | None = None
    # Per service with held requests: the one look-out for a ready replica.
    lookouts: dict[int, asyncio.Task] = dataclasses.field(default_factory=dict)


def _timeouts() -> dict[str, float]:
    return {
        "connect": settings.SERVICE_GATEWAY_CONNECT_TIMEOUT,
        "read": settings.SERVICE_GATEWAY_READ_TIMEOUT,
        "write": settings.SERVICE_GATEWAY_READ_TIMEOUT,
        "pool": settings.SERVICE_GATEWAY_CONNECT_TIMEOUT,
    }


async def _json(send: Send, status: int, detail: str, code: str, headers=()) -> None:
    body = json.dumps({"detail": detail, "code": code}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ServiceGateway:
    """ASGI middleware: `/svc/…` here, everything else to `app` (Django)."""

    def __init__(self, app):
        self.app = app
        self._loops: dict[int, LoopState] = {}
        self._turns: dict[int, itertools.count] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    def state(self) -> LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(id(loop))
        if state is None:
            # (A transport reads no proxy from the environment and follows no redirect.)
            transport = httpx.AsyncHTTPTransport()
            state = self._loops[id(loop)] = LoopState(
                transport=transport, tally=traffic.TrafficTally()
            )
        if state.recorder is None or state.recorder.done():
            state.recorder = loop.create_task(self._record_every_tick(state))
        return state

    def transport(self) -> httpx.AsyncHTTPTransport:
        """One connection pool per event loop (its connections belong to its loop)."""
        return self.state().transport

    async def _record_every_tick(self, state: LoopState) -> None:
        """Add this process's tally to the traffic samples and the replicas' requests in
        flight, just after each tick ends."""
        while True:
            await asyncio.sleep(traffic.TICK + traffic.FLUSH_AFTER - time.time() % traffic.TICK)
            taken, changes = state.tally.take(), state.tally.take_replicas()
            try:
                if taken:
                    tick = traffic.tick_of(time.time()) - 1
                    await _counted(traffic.traffic_record, None, tick=tick, taken=taken)
                if changes:
                    added = await _counted(traffic.replicas_in_flight_add, False, changes=changes)
                    if added is False:  # Redis failed: add them with the next flush
                        state.tally.replicas_not_flushed(changes)
            except Exception:  # the loop must outlive one bad write
                logger.exception("could not record the gateway's traffic")

    def _order(self, route: selectors.Route) -> list[selectors.Upstream]:
        turn = next(self._turns.setdefault(route.service_id, itertools.count()))
        start = turn % len(route.replicas)
        return route.replicas[start:] + route.replicas[:start]

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = split_path(scope["path"])
        if parts is None:
            await _json(send, 404, "Not found.", "not_found")
            return
        tenant_slug, name, rest = parts
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        route, allowed = await selectors.agateway_access(
            tenant_slug=tenant_slug, name=name, token=_bearer(headers)
        )
        if route is None:
            await _json(send, 404, "Not found.", "not_found")
            return
        observed = GatewayRequest(organisation=tenant_slug, service=name)
        send = observed.watching(send)
        with observed.counted():
            if not allowed:
                await _json(
                    send,
                    401,
                    "This service needs a service token: Authorization: Bearer <token>.",
                    "not_authenticated",
                    [(b"www-authenticate", b'Bearer realm="service"')],
                )
                return
            if route.status == ServiceStatus.PAUSED:  # not demand: nothing may start
                await _json(
                    send,
                    402,
                    f"The service is paused: {route.status_reason or 'its budget is used up'}. "
                    "It serves again once an owner or admin raises the budget.",
                    "payment_required",
                )
                return
            tally = self.state().tally
            tally.started(route.service_id)  # a held request is demand too
            try:
                if not route.replicas:
                    with observed.held():
                        held = await self.hold(route, send)
                    if held is None:
                        return
                    route = held
                prefix = f"{PREFIX}{tenant_slug}/{name}"
                await self.forward(scope, receive, send, route, rest, headers, prefix, observed)
            finally:
                tally.finished(route.service_id)

    async def hold(self, route: selectors.Route, send: Send) -> selectors.Route | None:
        """No replica is ready: hold the request until one is (the first one held wakes
        the service), or answer why not and return None."""
        if route.status == ServiceStatus.FAILED:
            await _json(
                send,
                503,
                "The service is failing: its replicas keep ending (its page says why).",
                "service_unavailable",
            )
            return None
        service_id = route.service_id
        position = await _counted(traffic.held_enter, 1, service_id=service_id)
        if position is None:
            await _json(
                send,
                503,
                f"{settings.SERVICE_COLD_START_QUEUE} requests are already waiting for this "
                "service to start; try again shortly.",
                "service_unavailable",
                [(b"retry-after", b"5")],
            )
            return None
        try:
            if position == 1:
                await sync_to_async(services.service_wake, thread_sensitive=False)(
                    service_id=service_id
                )
            timeout = settings.SERVICE_COLD_START_TIMEOUT
            try:
                lookout = asyncio.shield(self._lookout(service_id))
                replicas = await asyncio.wait_for(lookout, timeout)
            except TimeoutError:
                replicas = []
            if not replicas:
                await _json(
                    send,
                    504,
                    f"No replica of this service became ready within {timeout} s; its page "
                    "says what it is doing.",
                    "gateway_timeout",
                )
                return None
            return dataclasses.replace(route, replicas=replicas)
        finally:
            await _counted(traffic.held_leave, None, service_id=service_id)

    def _lookout(self, service_id: int) -> asyncio.Task:
        """The task that waits for a ready replica of the service, shared by the requests
        this process holds for it."""
        lookouts = self.state().lookouts
        task = lookouts.get(service_id)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._look_for_ready(service_id))
            lookouts[service_id] = task
        return task

    async def _look_for_ready(self, service_id: int) -> list[selectors.Upstream]:
        deadline = time.monotonic() + settings.SERVICE_COLD_START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                replicas = await sync_to_async(_ready_replicas)(service_id)
            except DatabaseError as error:  # try again: the held requests still wait
                logger.warning("looking for a ready replica of %s: %s", service_id, error)
                replicas = []
            if replicas:
                return replicas
            await asyncio.sleep(READY_POLL_SECONDS)
        return []

    async def forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: selectors.Route,
        rest: str,
        headers: list[tuple[bytes, bytes]],
        prefix: str,
        observed: GatewayRequest,
    ) -> None:
        method = scope["method"]
        query = scope.get("query_string") or b""
        drop = HOP_BY_HOP | ({b"authorization"} if selectors.needs_token(route) else set())
        upstream_headers = [(k, v) for k, v in headers if k.lower() not in drop]
        client_addr = (scope.get("client") or ["", 0])[0]
        upstream_headers += [
            (b"x-forwarded-for", str(client_addr).encode()),
            (b"x-forwarded-proto", scope.get("scheme", "http").encode()),
            (b"x-forwarded-prefix", prefix.encode()),
        ]
        body_started = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal body_started
            body_started = True
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    return

        has_body = any(k.lower() in (b"content-length", b"transfer-encoding") for k, _ in headers)
        tally = self.state().tally
        ordered = self._order(route)
        attempts = ordered[:2] if method in IDEMPOTENT else ordered[:1]
        response = None
        counted: int | None = None  # the replica this request is counted on
        try:
            for index, (replica_id, host, port, revision) in enumerate(attempts):
                tally.replica_started(replica_id)
                counted = replica_id
                url = f"http://{host}:{port}{rest}" + (
                    f"?{query.decode('latin-1')}" if query else ""
                )
                request = httpx.Request(
                    method,
                    url,
                    headers=upstream_headers,
                    content=body() if has_body else None,
                    extensions={"timeout": _timeouts()},
                )
                try:
                    response = await self.transport().handle_async_request(request)
                    observed.revision = str(revision)
                    break
                except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as error:
                    tally.replica_finished(replica_id)
                    counted = None
                    retry = index + 1 < len(attempts) and not body_started
                    logger.info("replica at %s:%s failed (%s); retry: %s", host, port, error, retry)
                    if not retry:
                        await _json(
                            send, 502, "The service's replica did not answer.", "bad_gateway"
                        )
                        return
                except httpx.TimeoutException:
                    await _json(send, 504, "The service did not answer in time.", "gateway_timeout")
                    return
            assert response is not None
            try:
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": [
                            (k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP
                        ],
                    }
                )
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            except httpx.HTTPError as error:  # the answer broke off: nothing more to say
                logger.info("stream from %s broke off: %s", request.url, error)
            finally:
                await response.aclose()
        finally:
            if counted is not None:
                tally.replica_finished(counted)
