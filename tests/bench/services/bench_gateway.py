"""Services benchmark (issue 29), on 127.0.0.1 only: uvicorn serving console.asgi (the
gateway) in front of echo replicas run as host processes, as in tests/services.

- **Gateway overhead**: the same paced load (RATE requests/s for SECONDS, several client
  threads on kept-alive connections) straight to a replica, then through the gateway
  with a service token; each request timed by its client from send to the last byte.
  p50/p99 of both and the p99 difference (target: < 5 ms at 200 requests/s). The
  baseline is measured in the same run, on the same machine, the same way.
- **Cold start**: a service at zero (its replica ready as soon as it listens) woken by
  one request, through a real Celery worker reached over the broker: the time to that
  request's answer (target: < 2 s plus the replica's own readiness delay, here 0).
- **Cold start on the sandbox cluster**: the same, for a service on the simulated
  Kubernetes cluster: the worker's pass raises the Deployment's count, the ReplicaSet
  makes a pod, the pod's server answers its readiness probe, the pass mirrors it ready
  and the gateway sends it the held request (same target).
- **Autoscaler decision latency**: from the start of a burst above twice the ready
  replicas' capacity, into a service idle for a panic window, to the scale-up decision
  being committed, with decisions (as beat asks for them between passes) every POLL
  seconds (target: < 1 s; the gateway adds its counters to Redis after each quarter of
  a second).

It asserts only that requests were answered (DESIGN.md: no timed assertions).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from contextlib import ExitStack

import httpx
import pytest

from console.launcher import asgi_server_argv, free_loopback_port
from console.queueing import enqueue_now
from services import reconcile, services, tasks
from services.models import ReplicaState, Service, ServiceStatus
from tests.bench.results import bench_size, record
from tests.servers import celery_worker_process, served  # noqa: F401 (a fixture)
from tests.services.conftest import (  # noqa: F401 (cluster, replicas_cleanup: fixtures)
    cluster,
    echo_spec,
    reconcile_until,
    replicas_cleanup,
)
from tests.services.test_kubernetes import spec

pytestmark = pytest.mark.usefixtures("replicas_cleanup")

logging.getLogger("httpx").setLevel(logging.WARNING)  # a log line per request otherwise

RATE = 200  # requests per second
SECONDS = 5 if bench_size() == "smoke" else 30
THREADS = 8
POLL = 0.1  # seconds between decisions while a burst goes on


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def paced(base_url: str, path: str, headers: dict) -> tuple[list[float], int]:
    """RATE requests/s for SECONDS from THREADS threads, each on its own schedule; the
    latencies in ms and how many answers were not 200."""
    latencies: list[float] = []
    failed = 0
    lock = threading.Lock()
    start = time.monotonic() + 0.2
    per_thread = RATE / THREADS

    def sender(index: int) -> None:
        nonlocal failed
        mine, bad = [], 0
        with httpx.Client(base_url=base_url, headers=headers, timeout=10) as client:
            client.get(path)  # the connection, before the clock starts
            count = int(per_thread * SECONDS)
            for n in range(count):
                due = start + (n + index / THREADS) / per_thread
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                sent = time.monotonic()
                answer = client.get(path)
                mine.append((time.monotonic() - sent) * 1000)
                bad += answer.status_code != 200
        with lock:
            latencies.extend(mine)
            failed += bad

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, failed


@pytest.fixture
def gateway(transactional_db, tmp_path, monkeypatch):
    def start(**env: str) -> httpx.Client:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        port = free_loopback_port()
        argv = asgi_server_argv("127.0.0.1", port)
        server = stack.enter_context(served("uvicorn", argv, port, tmp_path / "u.log"))
        return stack.enter_context(httpx.Client(base_url=server.url, timeout=60))

    with ExitStack() as stack:
        yield start


def test_gateway_overhead_against_the_replica_itself(gateway, world, catalog):
    client = gateway()
    service = services.service_create(
        tenant=world.tenant, user=None, spec=echo_spec(name="bench", min_replicas=1)
    )
    _, token = services.service_token_create(service=service, user=None, name="bench")
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    port = service.replicas.get(state=ReplicaState.READY).host_port
    direct, direct_failed = paced(f"http://127.0.0.1:{port}", "/whoami", {})
    through, through_failed = paced(
        str(client.base_url), "/svc/acme/bench/whoami", {"Authorization": f"Bearer {token}"}
    )
    assert direct_failed == 0 and through_failed == 0
    assert len(direct) == len(through) == int(RATE / THREADS * SECONDS) * THREADS
    load = f"{RATE} req/s for {SECONDS} s"
    for name, values in (("straight to the replica", direct), ("through the gateway", through)):
        record(
            "services",
            f"{name}, {load}: p50 {statistics.median(values):.1f} ms, p99",
            percentile(values, 0.99),
            "ms",
        )
    overhead = percentile(through, 0.99) - percentile(direct, 0.99)
    record(
        "services",
        f"gateway p99 overhead at {RATE} req/s (p50 "
        f"{statistics.median(through) - statistics.median(direct):.1f} ms)",
        overhead,
        "ms",
        target="< 5 ms",
        baseline=f"replica p99 {percentile(direct, 0.99):.1f} ms",
        met=overhead < 5,
    )


WINDOWS = {"SERVICE_AUTOSCALE_STABLE_WINDOW": 10, "SERVICE_AUTOSCALE_PANIC_WINDOW": 2}


@pytest.fixture
def cold_env(monkeypatch, settings):
    """Settings of every process (the worker's, the gateway's and this one's reconcile
    passes), set before the processes start."""
    for name, value in {**WINDOWS, "SERVICE_SCALE_TO_ZERO_GRACE": 300}.items():
        monkeypatch.setenv(name, str(value))
        setattr(settings, name, value)


@pytest.mark.usefixtures("cold_env", "celery_worker_process")
def test_cold_start_and_autoscaler_decision_latency(gateway, world, catalog):
    client = gateway()
    service = services.service_create(
        tenant=world.tenant,
        user=None,
        spec=echo_spec(
            name="cold", auth="public", min_replicas=0, max_replicas=3,
            autoscale_metric="concurrency", autoscale_target=1,
        ),
    )  # fmt: skip
    began = time.monotonic()
    answer = client.get("/svc/acme/cold/whoami")
    cold = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    record(
        "services",
        "cold start: first request at zero → its answer (replica readiness delay 0 s)",
        cold * 1000,
        "ms",
        target="< 2000 ms",
        met=cold < 2,
    )

    # A burst of 6 slow requests in flight against one ready replica (target 1 each),
    # into a service idle for a panic window (not on the heels of the cold request, which
    # would be averaged in with it).
    reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    time.sleep(WINDOWS["SERVICE_AUTOSCALE_PANIC_WINDOW"] + 0.5)
    before = service.scale_events.count()
    stop = threading.Event()

    def slow() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as mine:
            while not stop.is_set():
                mine.get("/svc/acme/cold/sleep?s=0.5")

    senders = [threading.Thread(target=slow, daemon=True) for _ in range(6)]
    burst = time.monotonic()
    for sender in senders:
        sender.start()
    decided = None
    try:
        while time.monotonic() - burst < 30:
            # The decision beat asks for between passes (the pass it then queues starts
            # the replicas).
            if reconcile.service_autoscale(service_id=service.pk):
                decided = time.monotonic() - burst
                break
            time.sleep(POLL)
        assert service.scale_events.count() > before
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=30)
    assert decided is not None, "no scale-up decision within 30 s"
    record(
        "services",
        f"autoscaler: burst start → scale-up decision (decisions every {POLL} s)",
        decided * 1000,
        "ms",
        target="< 1000 ms",
        met=decided < 1,
    )


@pytest.fixture
def sandbox_env(cluster, settings, monkeypatch):  # noqa: F811  (the services' sandbox)
    """The worker reaches the sandbox cluster too (its KUBECONFIG, set before it starts)."""
    monkeypatch.setenv("KUBECONFIG", settings.KUBECONFIG)


@pytest.mark.usefixtures("cold_env", "sandbox_env", "celery_worker_process")
def test_cold_start_on_the_sandbox_cluster(gateway, world):
    client = gateway()
    service = services.service_create(
        tenant=world.tenant,
        user=None,
        spec=spec(name="cold", auth="public", min_replicas=0, autoscale_metric="rps"),
    )
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.SCALED_TO_ZERO)
    # The worker's first call to a cluster loads the client and checks the namespace
    # (about 2 s, once per process): one pass of its own first, as a running worker has.
    before = service.updated_at
    enqueue_now(tasks.service_reconcile_task, service.pk)
    deadline = time.monotonic() + 30
    while Service.objects.get(pk=service.pk).updated_at == before:
        assert time.monotonic() < deadline, "the worker ran no pass"
        time.sleep(0.1)
    began = time.monotonic()
    answer = client.get("/svc/acme/cold/whoami")
    cold = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    record(
        "services",
        "cold start on the sandbox cluster: first request at zero → its answer (pod "
        "readiness delay 0 s)",
        cold * 1000,
        "ms",
        target="< 2000 ms",
        met=cold < 2,
    )
