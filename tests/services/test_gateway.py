"""The gateway through a real ASGI server (uvicorn serving console.asgi, as deployed) to
real replicas (the echo server, sandboxed): token auth, 404s that reveal nothing, 503
for a failing service, round-robin, streamed bodies, a retry when a replica is gone, and
the upstream timeout; the gateway's counters on /metrics; a used-up budget's 402."""

from __future__ import annotations

import hashlib
import itertools
import os
import time

import httpx
import pytest
from django.utils import timezone

from billing.budgets.services import budget_create, budget_update, meter_and_enforce
from console.launcher import asgi_server_argv, free_loopback_port
from jobs.backends import host_processes
from services import services
from services.models import ReplicaState, ServiceStatus
from tests.servers import served
from tests.services.conftest import METRICS_TOKEN, echo_spec, metric_value, reconcile_until, scraped

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("replicas_cleanup")]

TINY = "0.000001"  # a budget any usage uses up


@pytest.fixture
def gateway(transactional_db, tmp_path, monkeypatch):
    # The server's own setting: a short upstream read timeout, to test it quickly.
    monkeypatch.setenv("SERVICE_GATEWAY_READ_TIMEOUT", "1.5")
    monkeypatch.setenv("METRICS_TOKEN", METRICS_TOKEN)
    port = free_loopback_port()
    argv = asgi_server_argv("127.0.0.1", port)
    with (
        served("uvicorn", argv, port, tmp_path / "u.log") as server,
        httpx.Client(base_url=server.url, timeout=20) as client,
    ):
        yield client


@pytest.fixture
def echo(world, catalog):
    service = services.service_create(tenant=world.tenant, user=world.owner, spec=echo_spec())
    _, raw = services.service_token_create(service=service, user=world.owner, name="test")
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    return service, {"Authorization": f"Bearer {raw}"}


def test_a_token_service_needs_its_token(gateway, echo):
    _, auth = echo
    assert gateway.get("/svc/acme/echo/whoami").status_code == 401
    wrong = {"Authorization": "Bearer ggs_not-a-token"}
    answer = gateway.get("/svc/acme/echo/whoami", headers=wrong)
    assert answer.status_code == 401 and answer.json()["code"] == "not_authenticated"
    answer = gateway.get("/svc/acme/echo/whoami?x=1", headers=auth)
    assert answer.status_code == 200
    seen = answer.json()
    assert seen["path"] == "/whoami?x=1"
    assert "authorization" not in seen["headers"]  # the token stays at the gateway
    assert seen["headers"]["x-forwarded-prefix"] == "/svc/acme/echo"


def test_cookies_go_to_the_caller_and_are_never_kept_by_the_gateway(gateway, echo, other_world):
    """A replica's cookie is its caller's: the gateway passes it on and sends it to no
    other request, of this service or of another organisation's on the same host."""
    _, auth = echo
    answer = gateway.get("/svc/acme/echo/set-cookie?v=alice", headers=auth)
    assert answer.status_code == 200 and answer.headers["set-cookie"] == "session=alice; Path=/"
    gateway.cookies.clear()  # (the test's own client keeps them: another caller doesn't)
    for _ in range(2):  # (both replicas)
        seen = gateway.get("/svc/acme/echo/whoami", headers=auth).json()["headers"]
        assert "cookie" not in seen
    foreign = services.service_create(
        tenant=other_world.tenant,
        user=None,
        spec=echo_spec(name="theirs", auth="public", min_replicas=1),
    )
    reconcile_until(foreign, lambda s: s.status == ServiceStatus.READY)
    seen = gateway.get(f"/svc/{other_world.tenant.slug}/theirs/whoami").json()["headers"]
    assert "cookie" not in seen


def test_a_revoked_token_is_refused(gateway, echo):
    service, auth = echo
    for token in service.tokens.all():
        services.service_token_revoke(token=token, user=None)
    assert gateway.get("/svc/acme/echo/whoami", headers=auth).status_code == 401


def test_unknown_and_foreign_services_are_the_same_404(gateway, echo, other_world):
    _, auth = echo
    foreign = services.service_create(
        tenant=other_world.tenant, user=None, spec=echo_spec(name="hidden", min_replicas=0)
    )
    _, foreign_raw = services.service_token_create(service=foreign, user=None, name="t")
    for path in ("/svc/acme/hidden/", "/svc/nobody/echo/", "/svc/acme/", "/svc/"):
        answer = gateway.get(path, headers=auth)
        assert answer.status_code == 404 and answer.json() == {
            "detail": "Not found.",
            "code": "not_found",
        }
    # A token of one service opens no other, in its tenant or another.
    assert gateway.get("/svc/globex/hidden/", headers=auth).status_code == 401
    other = {"Authorization": f"Bearer {foreign_raw}"}
    assert gateway.get("/svc/acme/echo/whoami", headers=other).status_code == 401


def test_a_failing_service_is_a_503_at_once_that_says_so(gateway, world, catalog, settings):
    # No replica will come: the request is not held (holding is for a replica starting).
    settings.SERVICE_MAX_RESTARTS = 1
    broken = services.service_create(
        tenant=world.tenant,
        user=None,
        spec=echo_spec(
            name="broken", min_replicas=1, auth="public", command=["python3", "-c", "exit(3)"]
        ),
    )
    reconcile_until(broken, lambda s: s.status == ServiceStatus.FAILED)
    answer = gateway.get("/svc/acme/broken/whoami")
    assert answer.status_code == 503
    assert answer.json()["code"] == "service_unavailable"
    assert "keep ending" in answer.json()["detail"]


def test_requests_go_round_robin_over_ready_replicas(gateway, echo):
    _, auth = echo
    seen = [gateway.get("/svc/acme/echo/whoami", headers=auth).json()["instance"] for _ in range(6)]
    assert len(set(seen)) == 2
    assert seen[0::2] == [seen[0]] * 3 and seen[1::2] == [seen[1]] * 3


def test_bodies_stream_through_both_ways(gateway, echo):
    _, auth = echo
    payload = os.urandom(3 << 20)
    sent = 0

    def chunks():
        nonlocal sent
        for start in range(0, len(payload), 1 << 16):
            sent += 1
            yield payload[start : start + (1 << 16)]

    headers = {**auth, "Content-Length": str(len(payload))}
    with gateway.stream("POST", "/svc/acme/echo/echo", content=chunks(), headers=headers) as answer:
        assert answer.status_code == 200
        digest, pieces = hashlib.sha256(), 0
        for piece in answer.iter_raw():
            digest.update(piece)
            pieces += 1
    assert digest.hexdigest() == hashlib.sha256(payload).hexdigest()
    assert sent == 48 and pieces > 1  # sent and answered in pieces, not as one body


def test_server_sent_events_pass_through_as_they_are_sent(gateway, echo):
    _, auth = echo
    arrived = []
    with gateway.stream("GET", "/svc/acme/echo/events", headers=auth) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/event-stream"
        for line in answer.iter_lines():
            if line.startswith("data: "):
                arrived.append((line, time.monotonic()))
    assert [line for line, _ in arrived] == [f"data: token {n}" for n in range(4)]
    # Each event came when it was sent (0.5 s apart), not with the end of the stream.
    gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(arrived)]
    assert all(gap > 0.25 for gap in gaps), gaps


def test_a_replica_that_is_gone_is_retried_on_another(gateway, echo):
    service, auth = echo
    victim = service.replicas.first()
    host_processes.host_stop(victim.handle)  # dead, and the database does not know yet
    answers = [gateway.get("/svc/acme/echo/whoami", headers=auth) for _ in range(10)]
    assert [a.status_code for a in answers] == [200] * 10


def test_a_slow_replica_is_a_504(gateway, echo):
    _, auth = echo
    answer = gateway.get("/svc/acme/echo/sleep?s=3", headers=auth)
    assert answer.status_code == 504 and answer.json()["code"] == "gateway_timeout"


def test_the_gateway_counts_requests_per_revision_on_metrics(gateway, echo):
    service, auth = echo
    for _ in range(3):
        assert gateway.get("/svc/acme/echo/whoami", headers=auth).status_code == 200
    assert gateway.get("/svc/acme/echo/whoami").status_code == 401
    assert gateway.get("/svc/acme/made-up-name/").status_code == 404
    metrics = scraped(gateway)

    def value(name, **labels):
        return metric_value(metrics, name, **labels)

    echo_labels = {"organisation": "acme", "service": "echo"}
    served = {**echo_labels, "revision": "1"}
    assert value("gpugeek_service_requests_total", **served, code="200") == 3
    assert value("gpugeek_service_requests_total", **echo_labels, revision="", code="401") == 1
    assert value("gpugeek_service_request_duration_seconds_count", **served) == 3
    assert value("gpugeek_service_request_duration_seconds_bucket", **served, le="+Inf") == 3
    assert value("gpugeek_service_requests_in_flight", **echo_labels) == 0
    # Only services that exist are labelled: a made-up path mints no series.
    assert not [key for key in metrics if ("service", "made-up-name") in key[1]]
    # Scrape time: the replicas by state and the count the autoscaler wants.
    service.refresh_from_db()
    assert value("gpugeek_service_replicas", **echo_labels, state="ready") == 2
    assert value("gpugeek_service_desired_replicas", **echo_labels) == service.desired_replicas


def test_a_used_up_budget_drains_the_replicas_and_answers_402_until_raised(gateway, echo, world):
    service, auth = echo
    assert gateway.get("/svc/acme/echo/whoami", headers=auth).status_code == 200
    budget = budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
    meter_and_enforce(now=timezone.now())  # the replicas' seconds so far use it up
    answer = gateway.get("/svc/acme/echo/whoami", headers=auth)
    assert answer.status_code == 402, answer.text
    assert answer.json()["code"] == "payment_required"
    assert "Team cap" in answer.json()["detail"] and "raises the budget" in answer.json()["detail"]
    # Without its token a caller learns nothing about the budget.
    assert gateway.get("/svc/acme/echo/whoami").status_code == 401
    service = reconcile_until(
        service, lambda s: not s.replicas.exclude(state=ReplicaState.STOPPED).exists()
    )
    assert service.status == ServiceStatus.PAUSED and service.desired_replicas == 0

    budget_update(budget=budget, user=world.finance, amount="1000")
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    assert service.replicas.filter(state=ReplicaState.READY).count() == service.min_replicas
    assert gateway.get("/svc/acme/echo/whoami", headers=auth).status_code == 200
