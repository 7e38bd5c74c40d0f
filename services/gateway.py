"""The services gateway: `/svc/<tenant-slug>/<service>/…` in the console's ASGI app.

A plain ASGI app in front of Django (console/asgi.py mounts it): Django's request cycle
buffers nothing we need and would hold a worker thread for a streamed answer, so requests
here go straight to a replica with httpx's async client. Request and response bodies are
streamed chunk by chunk (never read whole). Replicas are taken round-robin among the READY
ones; an idempotent request whose replica refuses the connection (or drops it before any
answer, having read none of its body) is tried once more on another replica. Services
with `auth: token` need `Authorization: Bearer <service token>` (the header is not passed
on). An unknown tenant or service, and another tenant's service, are the same 404.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from services import selectors

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


def _lookup(tenant_slug: str, name: str, token: str) -> tuple[selectors.Route | None, bool]:
    """The route and whether the caller may use it (in the request's sync thread)."""
    close_old_connections()  # as Django's request_started does
    route = selectors.gateway_route(tenant_slug=tenant_slug, name=name)
    if route is None:
        return None, False
    if not selectors.needs_token(route):
        return route, True
    return route, bool(token) and selectors.service_token_valid(
        service_id=route.service_id, raw=token
    )


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
        self._clients: dict[int, httpx.AsyncClient] = {}
        self._turns: dict[int, itertools.count] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    def client(self) -> httpx.AsyncClient:
        """One pooled client per event loop (a client's connections belong to its loop)."""
        loop = id(asyncio.get_running_loop())
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(
                    connect=settings.SERVICE_GATEWAY_CONNECT_TIMEOUT,
                    read=settings.SERVICE_GATEWAY_READ_TIMEOUT,
                    write=settings.SERVICE_GATEWAY_READ_TIMEOUT,
                    pool=settings.SERVICE_GATEWAY_CONNECT_TIMEOUT,
                ),
                follow_redirects=False,
                trust_env=False,  # never through a proxy from the environment
            )
            self._clients[loop] = client
        return client

    def _order(self, route: selectors.Route) -> list[int]:
        turn = next(self._turns.setdefault(route.service_id, itertools.count()))
        start = turn % len(route.ports)
        return route.ports[start:] + route.ports[:start]

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = split_path(scope["path"])
        if parts is None:
            await _json(send, 404, "Not found.", "not_found")
            return
        tenant_slug, name, rest = parts
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        route, allowed = await sync_to_async(_lookup)(tenant_slug, name, _bearer(headers))
        if route is None:
            await _json(send, 404, "Not found.", "not_found")
            return
        if not allowed:
            await _json(
                send,
                401,
                "This service needs a service token: Authorization: Bearer <token>.",
                "not_authenticated",
                [(b"www-authenticate", b'Bearer realm="service"')],
            )
            return
        if not route.ports:
            await _json(
                send,
                503,
                "No replica of this service is ready yet; try again shortly.",
                "service_unavailable",
                [(b"retry-after", b"5")],
            )
            return
        await self.forward(
            scope, receive, send, route, rest, headers, f"{PREFIX}{tenant_slug}/{name}"
        )

    async def forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: selectors.Route,
        rest: str,
        headers: list[tuple[bytes, bytes]],
        prefix: str,
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
        ports = self._order(route)
        attempts = ports[:2] if method in IDEMPOTENT else ports[:1]
        response = None
        for index, port in enumerate(attempts):
            url = f"http://127.0.0.1:{port}{rest}" + (
                f"?{query.decode('latin-1')}" if query else ""
            )
            request = self.client().build_request(
                method, url, headers=upstream_headers, content=body() if has_body else None
            )
            try:
                response = await self.client().send(request, stream=True)
                break
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as error:
                retry = index + 1 < len(attempts) and not body_started
                logger.info("replica on port %s failed (%s); retry: %s", port, error, retry)
                if not retry:
                    await _json(send, 502, "The service's replica did not answer.", "bad_gateway")
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
            logger.info("stream from port %s broke off: %s", route.ports, error)
        finally:
            await response.aclose()
