"""Autoscaling and scale-from-zero end to end: real HTTP load through the gateway (uvicorn
serving console.asgi) to echo replicas on this host, the gateway's counters in the test
Redis, and reconcile passes deciding from them, with short windows.

Reconcile passes run in the test process (as beat would run them) where a test watches
the count; the scale-from-zero tests run a real Celery worker instead, which the gateway
wakes through the broker."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from console.launcher import asgi_server_argv, free_loopback_port
from services import reconcile, services
from services.models import ReplicaState, ScaleWindow, Service, ServiceStatus
from tests.servers import celery_worker_process, served, wait_until  # noqa: F401 (a fixture)
from tests.services.conftest import (
    METRICS_TOKEN,
    echo_spec,
    metric_value,
    ready_count,
    reconcile_until,
    scraped,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("replicas_cleanup")]


@pytest.fixture
def start_gateway(transactional_db, tmp_path, monkeypatch) -> Iterator[Callable]:
    """Starts the gateway with the given settings in its environment; an httpx client."""
    with ExitStack() as stack:

        def start(**env: str) -> httpx.Client:
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            port = free_loopback_port()
            server = stack.enter_context(
                served("uvicorn", asgi_server_argv("127.0.0.1", port), port, tmp_path / "u.log")
            )
            return stack.enter_context(httpx.Client(base_url=server.url, timeout=60))

        yield start


class Load:
    """Threads sending requests through the gateway until stopped, each answer's status
    counted (a connection error counts as its exception's name)."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.statuses: Counter = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _loop(self, path: str, stop: threading.Event) -> None:
        with httpx.Client(base_url=self.base_url, timeout=30) as client:
            turn = 0
            while not stop.is_set() and not self._stop.is_set():
                turn += 1
                try:
                    if turn % 2:
                        answer = client.get(path)
                    else:  # not idempotent: the gateway never retries it elsewhere
                        answer = client.post("/svc/acme/auto/echo", content=b"x" * 2048)
                        assert answer.content == b"x" * 2048
                    status = str(answer.status_code)
                except (httpx.HTTPError, AssertionError) as error:
                    status = type(error).__name__
                with self._lock:
                    self.statuses[status] += 1
                    if status != "200":
                        self.failures.append(f"{path}: {status}")

    def start(self, threads: int, path: str) -> threading.Event:
        """`threads` more senders of GET `path` (and POSTs); set the event to stop them."""
        stop = threading.Event()
        for _ in range(threads):
            thread = threading.Thread(target=self._loop, args=(path, stop), daemon=True)
            thread.start()
            self._threads.append(thread)
        return stop

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


@contextmanager
def load_on(client: httpx.Client) -> Iterator[Load]:
    load = Load(str(client.base_url))
    try:
        yield load
    finally:
        load.stop()


def running(service: Service) -> int:
    return service.replicas.exclude(state=ReplicaState.STOPPED).count()


def passes_until(service: Service, done: Callable[[Service], bool], timeout: float) -> int:
    """Reconcile passes every half second until `done`; the most replicas seen at once."""
    most = 0
    deadline = time.monotonic() + timeout
    while True:
        fresh = reconcile.service_reconcile(service_id=service.pk)
        most = max(most, running(fresh))
        if done(fresh):
            return most
        if time.monotonic() > deadline:
            states = list(fresh.replicas.values_list("state", "reason"))
            raise AssertionError(f"timed out: wants {fresh.desired_replicas}, has {states}")
        time.sleep(0.5)


def test_load_scales_up_and_drains_back_down_without_a_failed_request(
    start_gateway, world, catalog, settings
):
    settings.SERVICE_AUTOSCALE_STABLE_WINDOW = 6
    settings.SERVICE_AUTOSCALE_PANIC_WINDOW = 2
    gateway = start_gateway()
    service = services.service_create(
        tenant=world.tenant,
        user=None,
        spec=echo_spec(
            name="auto",
            auth="public",
            min_replicas=1,
            max_replicas=3,
            autoscale_metric="concurrency",
            autoscale_target=3,
            scale_down_delay=2,  # compressed like the windows
        ),
    )
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    with load_on(gateway) as load:
        heavy = load.start(10, "/svc/acme/auto/sleep?s=0.3")  # about 8 in flight
        most = passes_until(service, lambda s: ready_count(s) == 3, timeout=60)
        heavy.set()
        # Then a light load that keeps long requests in flight on the replicas being
        # drained: their drain must wait for them.
        load.start(2, "/svc/acme/auto/sleep?s=2.5")
        most = max(
            most,
            passes_until(
                service,
                lambda s: running(s) == 1 and s.desired_replicas == 1,
                timeout=60,
            ),
        )
        time.sleep(3)  # requests still go on against the one left
    assert load.failures == [], load.statuses
    assert load.statuses["200"] > 50
    assert most <= 3  # never above max_replicas
    events = list(service.scale_events.order_by("at", "pk"))
    ups = [e for e in events if e.to_replicas > e.from_replicas]
    downs = [e for e in events if e.to_replicas < e.from_replicas]
    assert ups and max(e.to_replicas for e in ups) == 3
    assert {e.window for e in ups} <= {ScaleWindow.PANIC, ScaleWindow.STABLE}
    assert ups[0].panic_value > 0 and ups[0].metric == "concurrency"
    assert downs and downs[-1].to_replicas == 1 and downs[-1].window == ScaleWindow.STABLE
    assert downs[-1].at > ups[-1].at


@pytest.fixture
def cold_env(monkeypatch):
    """Settings of every process of the scale-from-zero tests (the worker's reconcile
    and the gateway's queue), set before they start."""
    for name, value in {
        "SERVICE_COLD_START_QUEUE": "5",
        "SERVICE_COLD_START_TIMEOUT": "60",
        "SERVICE_SCALE_TO_ZERO_GRACE": "300",
    }.items():
        monkeypatch.setenv(name, value)


def zero_service(world, name: str, ready_delay: str = "0") -> Service:
    return services.service_create(
        tenant=world.tenant,
        user=None,
        spec=echo_spec(
            name=name,
            auth="public",
            min_replicas=0,
            max_replicas=2,
            env={"READY_DELAY": ready_delay},
        ),
    )


@pytest.mark.usefixtures("cold_env", "celery_worker_process")
def test_a_request_at_zero_waits_for_the_first_replica_and_gets_its_answer(
    start_gateway, world, catalog, settings
):
    service = zero_service(world, "cold", ready_delay="1")
    assert service.status == ServiceStatus.SCALED_TO_ZERO and not service.replicas.exists()
    gateway = start_gateway(METRICS_TOKEN=METRICS_TOKEN)
    cold = {"organisation": "acme", "service": "cold"}
    answers: list[httpx.Response] = []
    began = time.monotonic()
    request = threading.Thread(target=lambda: answers.append(gateway.get("/svc/acme/cold/whoami")))
    request.start()
    # While it waits, /metrics says so: one request held, one in flight.
    wait_until(
        lambda: metric_value(scraped(gateway), "gpugeek_service_requests_held", **cold) == 1,
        timeout=30,
        what="the held request on /metrics",
    )
    assert metric_value(scraped(gateway), "gpugeek_service_requests_in_flight", **cold) == 1
    request.join(timeout=60)
    waited = time.monotonic() - began
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    metrics = scraped(gateway)
    assert metric_value(metrics, "gpugeek_service_requests_held", **cold) == 0
    served = {**cold, "revision": "1"}
    assert metric_value(metrics, "gpugeek_service_requests_total", **served, code="200") == 1
    # Its time held counts in its duration (the replica's readiness delay is 1 s).
    assert metric_value(metrics, "gpugeek_service_request_duration_seconds_sum", **served) >= 1
    assert answer.json()["path"] == "/whoami"
    assert waited >= 1  # the replica's own readiness delay
    event = service.scale_events.get()
    assert (event.from_replicas, event.to_replicas, event.window) == (
        0,
        1,
        ScaleWindow.COLD_START,
    )
    assert event.held_requests == 1
    assert event.cold_start_seconds is not None and 1 <= event.cold_start_seconds <= waited
    # Served now without waiting; idle past the grace, it goes back to zero.
    assert gateway.get("/svc/acme/cold/whoami").status_code == 200
    settings.SERVICE_SCALE_TO_ZERO_GRACE = 1
    settings.SERVICE_AUTOSCALE_STABLE_WINDOW = 2
    time.sleep(3)
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.SCALED_TO_ZERO)
    last = service.scale_events.order_by("-at", "-pk").first()
    assert (last.to_replicas, last.window) == (0, ScaleWindow.IDLE)


@pytest.mark.usefixtures("cold_env", "celery_worker_process")
def test_requests_held_at_zero_all_succeed_and_beyond_the_queue_get_503(
    start_gateway, world, catalog
):
    zero_service(world, "burst", ready_delay="3")
    gateway = start_gateway()
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def call() -> None:
        with httpx.Client(base_url=str(gateway.base_url), timeout=60) as client:
            answer = client.get("/svc/acme/burst/whoami")
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {200: 5, 503: 3}, [(a.status_code, a.text) for a in answers]
    refused = next(a for a in answers if a.status_code == 503)
    assert refused.json()["code"] == "service_unavailable"
    assert "waiting for this service to start" in refused.json()["detail"]
    assert refused.headers["retry-after"] == "5"


def test_a_held_request_gets_a_504_only_after_the_cold_start_timeout(start_gateway, world, catalog):
    # No worker here: nothing starts a replica, so the wait runs out.
    zero_service(world, "stuck")
    gateway = start_gateway(SERVICE_COLD_START_TIMEOUT="2")
    began = time.monotonic()
    answer = gateway.get("/svc/acme/stuck/whoami")
    assert answer.status_code == 504 and time.monotonic() - began >= 2
    assert answer.json()["code"] == "gateway_timeout"
    assert "within 2 s" in answer.json()["detail"]
