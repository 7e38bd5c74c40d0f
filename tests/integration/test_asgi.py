"""The real ASGI server (uvicorn serving console.asgi) over HTTP and WebSocket.

Starting the server costs seconds, so each test walks several requests on one server.
"""

from __future__ import annotations

import httpx
import pytest
import websocket
from django.db import connection

from console.services.tokens import api_token_create
from tests.factories import DEFAULT_PASSWORD
from tests.integration.helpers import sign_in

pytestmark = pytest.mark.integration


def test_http_health_sign_in_and_api_token(asgi_server, world):
    with httpx.Client(base_url=asgi_server.url, timeout=10) as client:
        health = client.get("/healthz")
        assert health.status_code == 200, asgi_server.log()
        assert health.json() == {"status": "ok"}  # anonymous callers get the status only

        # A POST without the CSRF token is refused and signs nobody in.
        client.get("/accounts/login/")
        forged = client.post(
            "/accounts/login/", data={"username": world.member.email, "password": DEFAULT_PASSWORD}
        )
        assert forged.status_code == 403
        assert client.get("/").status_code == 302

        signed_in = sign_in(client, world.member.email, DEFAULT_PASSWORD)
        assert signed_in.status_code == 302, signed_in.text
        assert signed_in.headers["location"] == "/"
        dashboard = client.get("/")
        assert dashboard.status_code == 200
        assert world.tenant.name in dashboard.text

    with httpx.Client(base_url=f"{asgi_server.url}/api/v1", timeout=10) as api:
        created = api.post(
            "/auth/token",
            json={"email": world.admin.email, "password": DEFAULT_PASSWORD, "name": "ci"},
        )
        assert created.status_code == 201, created.text
        token = created.json()["token"]

        me = api.get("/me", headers={"Authorization": f"Bearer {token}"})
        assert me.status_code == 200, me.text
        assert me.json()["email"] == world.admin.email
        assert me.json()["tenant"] == world.tenant.slug
        assert me.json()["role"] == "admin"

        assert api.get("/me").status_code in (401, 403)
        assert api.get("/me", headers={"Authorization": f"Bearer {token}x"}).status_code == 401


def _websocket_refusal_status(url: str, **options) -> int:
    """Open a WebSocket and return the handshake's refusal status; fail if it opens."""
    try:
        sock = websocket.create_connection(url, timeout=5, **options)
    except websocket.WebSocketBadStatusException as refused:
        return refused.status_code
    sock.close()
    raise AssertionError(f"WebSocket {url} was accepted")


def test_websockets_are_refused(asgi_server):
    url = f"{asgi_server.ws_url}/ws/nope/"
    # Foreign or missing Origin: AllowedHostsOriginValidator refuses before routing.
    assert _websocket_refusal_status(url, origin="http://evil.example") == 403
    assert _websocket_refusal_status(url, suppress_origin=True) == 403
    # Allowed origin, unknown path: no route, so the handshake fails (Channels answers 500).
    assert _websocket_refusal_status(url, origin=asgi_server.url) >= 400
    assert asgi_server.process.poll() is None, "the server died on a refused WebSocket"


def test_the_web_server_reuses_pooled_database_connections(asgi_server, world):
    """console.asgi turns the connection pool on: on PostgreSQL, requests reuse the
    server's connections instead of opening one each (what a request spent connecting
    cost more than most pages' queries)."""
    if connection.vendor != "postgresql":
        pytest.skip("connection pooling is PostgreSQL's (SQLite opens a file)")
    _, token = api_token_create(user=world.member, tenant=world.tenant, name="pool")
    auth = {"Authorization": f"Bearer {token}"}

    def server_connections() -> set[int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return {pid for (pid,) in cursor.fetchall()}

    with httpx.Client(base_url=asgi_server.url, timeout=10, headers=auth) as client:
        for _ in range(5):
            assert client.get("/api/v1/jobs").status_code == 200, asgi_server.log()
        held = server_connections()
        for _ in range(20):
            assert client.get("/api/v1/jobs").status_code == 200
        # Still open after the requests ended, and no new one opened for the 20 requests.
        assert held and server_connections() == held
        assert len(held) <= 10  # DATABASE_POOL_MAX_SIZE's default
