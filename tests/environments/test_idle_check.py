"""The staff-defined idleness check (environments.idle_check) against a real HTTP server
on 127.0.0.1: what the console sends, each kind of answer as a reading, and that an
answer it can't read (an error, a timeout, a body that isn't the agreed object) counts as
active, so a broken check never stops an environment."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from environments import selectors, services
from environments.idle_check import SOURCE
from environments.idle_rule import IdleStep
from environments.models import Environment, EnvironmentStatus
from jobs.models import JobEvent, JobStatus


@dataclass
class CheckServer:
    url: str
    status: int = 200
    body: object = field(default_factory=lambda: {"active": True})
    delay: float = 0.0
    received: list[dict] = field(default_factory=list)


@pytest.fixture
def check_server(settings) -> Iterator[CheckServer]:
    """The staff's check service, answering what the test sets; the console pointed at it."""
    server: CheckServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            server.received.append(
                {
                    "path": self.path,
                    "authorization": self.headers.get("Authorization"),
                    "json": json.loads(self.rfile.read(length)),
                }
            )
            time.sleep(server.delay)
            raw = server.body if isinstance(server.body, bytes) else json.dumps(server.body)
            payload = raw if isinstance(raw, bytes) else raw.encode()
            self.send_response(server.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):  # quiet
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server = CheckServer(url=f"http://127.0.0.1:{http.server_address[1]}/idle")
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    settings.ENVIRONMENT_IDLE_CHECK_URL = server.url
    settings.ENVIRONMENT_IDLE_CHECK_TOKEN = "staff-secret"
    settings.ENVIRONMENT_IDLE_CHECK_TIMEOUT = 1.0
    try:
        yield server
    finally:
        http.shutdown()
        http.server_close()


def staff_reading(environment, now=None):
    now = now or timezone.now()
    policy = services.idle_policy_validate(environment.idle_policy)
    readings = selectors.environment_activities(environment=environment, policy=policy, now=now)
    return next(r for r in readings if r.source == SOURCE)


def test_without_a_url_there_is_no_staff_check(running, settings):
    settings.ENVIRONMENT_IDLE_CHECK_URL = ""
    policy = services.idle_policy_validate(running.idle_policy)
    sources = selectors.environment_activities(
        environment=running, policy=policy, now=timezone.now()
    )
    assert SOURCE not in [s.source for s in sources]


def test_the_console_sends_the_environment_and_the_other_readings_with_its_token(
    running, check_server, world
):
    now = timezone.now()
    check_server.body = {"active": True, "detail": "license seat in use by alice"}
    reading = staff_reading(running, now)
    assert reading.last_active_at == now
    assert reading.detail == "active — license seat in use by alice"
    (call,) = check_server.received
    assert call["path"] == "/idle" and call["authorization"] == "Bearer staff-secret"
    sent = call["json"]
    assert sent["organisation"] == world.tenant.slug and sent["environment"] == "box"
    assert sent["job"] == running.current_job_id and sent["gpus"] == 0
    assert sent["interactive"] == running.interactive
    assert sent["running_since"] == running.current_job.running_since.isoformat()
    sources = [r["source"] for r in sent["readings"]]
    assert sources[:2] == ["start", "ssh"] and SOURCE not in sources


def test_idle_answers_count_from_what_they_say_but_not_before_the_start(running, check_server):
    started = running.current_job.running_since
    now = timezone.now()
    check_server.body = {"active": False}
    assert staff_reading(running, now).last_active_at == started
    ten_ago = now - timedelta(minutes=10)
    check_server.body = {"active": False, "last_active_at": ten_ago.isoformat(), "detail": "x"}
    reading = staff_reading(running, now)
    assert reading.last_active_at == ten_ago and reading.detail.endswith("— x")
    check_server.body = {"active": False, "last_active_at": "2001-01-01T00:00:00+00:00"}
    assert staff_reading(running, now).last_active_at == started
    future = (now + timedelta(days=1)).isoformat()
    check_server.body = {"active": False, "last_active_at": future}
    assert staff_reading(running, now).last_active_at == now


@pytest.mark.parametrize(
    ("status", "body", "delay", "why"),
    [
        (500, {"active": False}, 0, "HTTP 500"),
        (200, b"<html>oops</html>", 0, "not JSON"),
        (200, ["active"], 0, 'no "active"'),
        (200, {"active": "no"}, 0, 'no "active"'),
        (200, {"active": False, "last_active_at": "yesterday"}, 0, "ISO 8601"),
        (200, {"active": False, "last_active_at": "2026-12-05T09:00:00"}, 0, "offset"),
        (200, {"active": False}, 2.0, "no answer in time"),
    ],
)
def test_an_answer_that_cant_be_read_counts_as_active(
    running, check_server, status, body, delay, why
):
    check_server.status, check_server.body, check_server.delay = status, body, delay
    reading = staff_reading(running)
    assert reading.last_active_at is None
    assert why in reading.detail and "counted as active" in reading.detail


def test_a_check_nobody_answers_counts_as_active(running, settings):
    settings.ENVIRONMENT_IDLE_CHECK_URL = "http://127.0.0.1:9/idle"  # discard: refused
    reading = staff_reading(running)
    assert reading.last_active_at is None and "ConnectError" in reading.detail


def test_the_staff_check_keeps_an_otherwise_idle_environment_running_and_is_on_the_timeline(
    running, check_server
):
    # Idle for 55 of its 60 minutes by every other source: a warning, unless the check
    # says someone is at work.
    check_server.body = {"active": True, "detail": "a batch of renders is queued"}
    assert services.environment_idle_check(environment=running).step is IdleStep.ACTIVE
    check_server.body = {"active": False, "detail": "no license seat in use"}
    decision = services.environment_idle_check(environment=running)
    assert decision.step is IdleStep.WARN
    warned = JobEvent.objects.filter(job=running.current_job).last()
    assert "staff check: idle — no license seat in use" in warned.reason
    later = timezone.now() + timedelta(minutes=6)
    check_server.body = {"active": False}
    fresh = Environment.objects.select_related("tenant", "current_job", "created_by")
    stopped = services.environment_idle_check(environment=fresh.get(pk=running.pk), now=later)
    assert stopped.step is IdleStep.STOP
    running.refresh_from_db()
    assert running.current_job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED)
    assert running.status in (EnvironmentStatus.STOPPING, EnvironmentStatus.STOPPED)


def test_a_broken_check_never_stops_an_environment(running, check_server):
    check_server.status = 503
    later = timezone.now() + timedelta(hours=5)
    fresh = Environment.objects.select_related("tenant", "current_job", "created_by")
    decision = services.environment_idle_check(environment=fresh.get(pk=running.pk), now=later)
    assert decision.step is IdleStep.ACTIVE
    running.refresh_from_db()
    assert running.current_job.status == JobStatus.RUNNING
