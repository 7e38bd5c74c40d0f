"""Issue 13 §4: /healthz tells an anonymous caller only whether the console is healthy;
hosts, pids, errors and heartbeats are for staff sessions and the HEALTHZ_TOKEN bearer."""

from __future__ import annotations

import pytest
from django.test import Client

from console import health, heartbeats
from tests.conftest import signed_in_client
from tests.factories import UserFactory

TOKEN = "healthz-test-token-0123456789"


@pytest.fixture
def beating(db, settings):
    settings.HEALTHZ_TOKEN = TOKEN
    heartbeats.heartbeat_record(component="worker")  # records this host and pid


def test_an_anonymous_caller_gets_the_status_only(beating):
    response = Client().get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]


def test_an_anonymous_caller_gets_503_without_the_error_text(beating, monkeypatch):
    failure = {"status": "error", "error": "ConnectionError: 10.1.2.3:6379 refused"}
    monkeypatch.setattr(health, "_check_redis", lambda: failure)

    response = Client().get("/healthz")

    assert response.status_code == 503
    assert response.json() == {"status": "error"}
    assert b"10.1.2.3" not in response.content


@pytest.mark.parametrize(
    "header",
    ["Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer ", TOKEN, ""],
)
def test_a_wrong_token_gets_the_status_only(beating, header):
    response = Client().get("/healthz", HTTP_AUTHORIZATION=header)

    assert response.json() == {"status": "ok"}


def test_the_token_shows_the_components(beating, monkeypatch):
    failure = {"status": "error", "error": "ConnectionError: refused"}
    monkeypatch.setattr(health, "_check_redis", lambda: failure)

    response = Client().get("/healthz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["redis"]
    assert body["components"]["redis"] == failure
    assert {"host", "pid"} <= set(body["components"]["worker"])


def test_no_token_configured_means_no_bearer_access(beating, settings):
    settings.HEALTHZ_TOKEN = ""

    response = Client().get("/healthz", HTTP_AUTHORIZATION="Bearer ")

    assert response.json() == {"status": "ok"}


def test_staff_sessions_see_the_components_and_tenant_users_dont(beating, world):
    staff = UserFactory(is_staff=True)

    staff_body = signed_in_client(staff).get("/healthz").json()
    owner_body = signed_in_client(world.owner, world.tenant).get("/healthz").json()

    assert set(staff_body["components"]) >= {"database", "redis", "worker", "beat", "watcher"}
    assert owner_body == {"status": "ok"}
