"""The Jupyter gateway: `/env/<organisation>/<environment>/…` proxied to the Jupyter server
of the environment's job (environments.jupyter), for members signed in to the console.

HTTP goes through Django (its session decides who may pass); the answer is streamed back
from httpx's async client, never read whole. The kernels' WebSockets go through Channels
(the same session, the Origin checked against the console's hosts) to the server with
the `websockets` client, frames relayed both ways as they come. Only the environment's
creator gets through (environments.selectors.may_open_jupyter says why). Either way the gateway
adds the server's token, so the user never types one, and passes on none of the
console's own cookies or credentials: the job never sees the user's session. Anyone who
may not use the environment (another organisation's member, someone signed out of it)
gets the same 404 as for a name that doesn't exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from http.cookies import SimpleCookie

import httpx
import websockets
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.csrf import csrf_exempt

from environments import jupyter, selectors
from environments.models import Environment
from services.gateway import HOP_BY_HOP

logger = logging.getLogger(__name__)

SKIPPED_REQUEST_HEADERS = {
    *(name.decode() for name in HOP_BY_HOP),
    "cookie",  # the console's session: only Jupyter's own XSRF cookie goes on
    "authorization",
    "content-length",
    "origin",
    "referer",
    "x-csrftoken",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
}
SKIPPED_RESPONSE_HEADERS = {*(name.decode() for name in HOP_BY_HOP), "set-cookie"}
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
# Jupyter's own cookie the notebook's pages read and send back (and its login cookie,
# `username-<host>`, passed back to the browser but never needed: the token is ours).
JUPYTER_COOKIES = ("_xsrf",)
CONNECT_SECONDS = 10.0


def _upstream(environment: Environment) -> tuple[str, int] | None:
    return selectors.environment_port_address(environment=environment, port=jupyter.JUPYTER_PORT)


def _same_origin(request: HttpRequest) -> bool:
    """A change (POST, PUT, DELETE) comes from the console's own pages: a browser says
    where a request comes from in Origin; a client without one isn't a browser page."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return url_has_allowed_host_and_scheme(
        origin, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )


def _headers(request: HttpRequest, environment: Environment) -> dict[str, str]:
    headers = {
        name: value
        for name, value in request.headers.items()
        if name.lower() not in SKIPPED_REQUEST_HEADERS
    }
    cookies = [f"{n}={request.COOKIES[n]}" for n in JUPYTER_COOKIES if n in request.COOKIES]
    if cookies:
        headers["Cookie"] = "; ".join(cookies)
    headers["Authorization"] = f"token {jupyter.jupyter_token(environment)}"
    return headers


@csrf_exempt  # Jupyter checks its own XSRF token; the Origin check below guards changes
async def jupyter_proxy(
    request: HttpRequest, tenant_slug: str, name: str, path: str = ""
) -> HttpResponseBase:
    user = await request.auser()
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    environment = await sync_to_async(selectors.jupyter_environment)(
        user=user, tenant_slug=tenant_slug, name=name
    )
    if environment is None:
        raise Http404("No such environment.")
    if request.method not in SAFE_METHODS and not _same_origin(request):
        return HttpResponse("Cross-site requests are refused.", status=403)
    address = await sync_to_async(_upstream)(environment)
    if address is None:
        return await sync_to_async(_unavailable)(request, environment, "isn't running")
    host, port = address
    query = request.META.get("QUERY_STRING", "")
    url = f"http://{host}:{port}{jupyter.base_path(environment)}{path}"
    url += f"?{query}" if query else ""
    client = httpx.AsyncClient(timeout=httpx.Timeout(CONNECT_SECONDS, read=None))
    upstream_request = client.build_request(
        request.method or "GET",
        url,
        headers=_headers(request, environment),
        content=request.body,
    )
    try:
        answer = await client.send(upstream_request, stream=True)
    except httpx.TransportError as error:
        await client.aclose()
        logger.info("Jupyter of environment %s not reached: %s", environment.pk, error)
        return await sync_to_async(_unavailable)(
            request, environment, "is starting: Jupyter isn't answering yet"
        )

    async def body():
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:
            await answer.aclose()
            await client.aclose()

    response = StreamingHttpResponse(body(), status=answer.status_code)
    for header, value in answer.headers.multi_items():
        if header.lower() == "set-cookie":
            _pass_cookie(response, value, jupyter.base_path(environment))
        elif header.lower() not in SKIPPED_RESPONSE_HEADERS:
            response.headers[header] = value
    return response


def _pass_cookie(response: HttpResponseBase, header: str, path: str) -> None:
    """Jupyter's own cookies only, kept to its path: a job never sets (or replaces) a
    cookie of the console's."""
    cookie: SimpleCookie = SimpleCookie()
    cookie.load(header)
    for name, morsel in cookie.items():
        if name in JUPYTER_COOKIES or name.startswith("username-"):
            morsel["path"] = path
            morsel["domain"] = ""
            response.cookies[name] = morsel


def _unavailable(request: HttpRequest, environment: Environment, why: str) -> HttpResponse:
    response = render(
        request,
        "environments/jupyter_unavailable.html",
        {"environment": environment, "why": why},
        status=503,
    )
    response["Retry-After"] = "5"
    return response


class JupyterSocket(AsyncWebsocketConsumer):
    """A kernel's (or terminal's) WebSocket, relayed to the environment's Jupyter."""

    upstream: websockets.ClientConnection | None = None
    relay: asyncio.Task | None = None

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        environment = await database_sync_to_async(selectors.jupyter_environment)(
            user=self.scope["user"], tenant_slug=kwargs["tenant_slug"], name=kwargs["name"]
        )
        address = await database_sync_to_async(_upstream)(environment) if environment else None
        if environment is None or address is None:
            await self.close()
            return
        host, port = address
        query = self.scope.get("query_string", b"").decode("latin-1")
        url = f"ws://{host}:{port}{self.scope['path']}" + (f"?{query}" if query else "")
        try:
            self.upstream = await websockets.connect(
                url,
                additional_headers={"Authorization": f"token {jupyter.jupyter_token(environment)}"},
                subprotocols=self.scope.get("subprotocols") or None,
                max_size=None,
                open_timeout=CONNECT_SECONDS,
                compression=None,
            )
        except (OSError, TimeoutError, websockets.WebSocketException) as error:
            logger.info("Jupyter socket of environment %s not opened: %s", environment.pk, error)
            await self.close()
            return
        await self.accept(subprotocol=self.upstream.subprotocol)
        self.relay = asyncio.create_task(self._from_upstream())

    async def _from_upstream(self) -> None:
        assert self.upstream is not None
        with contextlib.suppress(websockets.ConnectionClosed):
            async for message in self.upstream:
                if isinstance(message, bytes):
                    await self.send(bytes_data=message)
                else:
                    await self.send(text_data=message)
        await self.close()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.upstream is None:
            return
        with contextlib.suppress(websockets.ConnectionClosed):
            await self.upstream.send(text_data if text_data is not None else bytes_data or b"")

    async def disconnect(self, code: int) -> None:
        if self.relay is not None:
            self.relay.cancel()
        if self.upstream is not None:
            await self.upstream.close()
