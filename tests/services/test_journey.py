"""Issue 29's "done when", walked as a user would on the sandbox cluster, through the
REST API and the console's gateway (uvicorn, as deployed): a GPU model server from the
catalog deployed, called at its endpoint URL with a service token, scaled from 2 up
under load and back down, scaled to zero and called again, a new revision rolled out
and rolled back under load, and its cost on the Cost Explorer and the invoice.

Reconcile passes (which decide the count from the gateway's counters in Redis) run in
the test process, as beat would run them."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import urlsplit

import httpx
import pytest
from django.urls import reverse
from django.utils import timezone

from billing.invoices.services import invoice_draft_create, invoice_finalize
from billing.metering import meter_tick
from billing.metering.service_replicas import SERVICE_TIER
from jobs.backends.kubernetes import KubernetesBackend
from marketplace.services import capacity_sync
from services import reconcile
from services.models import ReplicaState, ScaleWindow, Service, ServiceStatus
from tests.conftest import signed_in_client, token_client
from tests.services.conftest import H100_PRODUCT, REGION, ready_count

pytestmark = pytest.mark.integration


class Traffic:
    """Threads calling the endpoint until stopped; every answer's status counted (a
    connection error as its exception's name)."""

    def __init__(self, base_url: str, path: str, headers: dict[str, str], threads: int):
        self.statuses: Counter = Counter()
        self.failures: list[str] = []  # the first few, with what they said
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(base_url, path, headers), daemon=True)
            for _ in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _loop(self, base_url: str, path: str, headers: dict[str, str]) -> None:
        with httpx.Client(base_url=base_url, headers=headers, timeout=30) as http:
            while not self._stop.is_set():
                try:
                    answer = http.get(path)
                    status, said = str(answer.status_code), answer.text[:200]
                except httpx.HTTPError as error:
                    status, said = type(error).__name__, str(error)
                with self._lock:
                    self.statuses[status] += 1
                    if status != "200" and len(self.failures) < 5:
                        self.failures.append(f"{status} at {time.monotonic():.1f}: {said}")

    def stop(self) -> Counter:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        return self.statuses


def serving(service: Service) -> int:
    return service.replicas.exclude(state=ReplicaState.STOPPED).count()


def passes_until(service: Service, done: Callable[[Service], bool], timeout: float = 60) -> int:
    """Reconcile passes every 0.3 s until `done`; the most replicas seen at once."""
    most, deadline = 0, time.monotonic() + timeout
    while True:
        fresh = reconcile.service_reconcile(service_id=service.pk)
        assert fresh is not None
        most = max(most, serving(fresh))
        if done(fresh):
            return most
        if time.monotonic() > deadline:
            states = list(fresh.replicas.values_list("state", "revision__number"))
            raise AssertionError(
                f"timed out: {fresh.status}, wants {fresh.desired_replicas}, {states}"
            )
        time.sleep(0.3)


def rolled_to(number: int) -> Callable[[Service], bool]:
    def done(service: Service) -> bool:
        revisions = set(
            service.replicas.exclude(state=ReplicaState.STOPPED).values_list(
                "revision__number", flat=True
            )
        )
        return revisions == {number} and ready_count(service) >= 1

    return done


def test_a_user_serves_a_model_on_the_sandbox_from_deploy_to_invoice(
    world, cluster, cluster_gateway, settings
):
    settings.SERVICE_AUTOSCALE_STABLE_WINDOW = 4  # compressed windows, as in test_autoscaling
    settings.SERVICE_AUTOSCALE_PANIC_WINDOW = 2
    settings.SERVICE_SCALE_TO_ZERO_GRACE = 1
    cluster.add_node("h100-1", labels={**REGION, "nvidia.com/gpu.product": H100_PRODUCT})
    capacity_sync(backend=KubernetesBackend(cluster.api_client()))
    api = token_client(world.owner, world.tenant)

    # Deploy: a GPU image of the catalog on the region's H100 pool.
    answer = api.post(
        "/api/v1/services",
        {
            "name": "llm",
            "image": "pytorch-2-5-cuda12-4",
            "command": ["python", "-m", "server"],
            "port": 8000,
            "region": "us-west",
            "gpu_type": "h100-80gb",
            "gpus_per_replica": 1,
            "min_replicas": 2,
            "max_replicas": 4,
            "readiness_path": "/healthz",
            "autoscale": {"metric": "concurrency", "target": 2, "scale_down_delay": 0},
            "env": {"SANDBOX_READY_AFTER_SECONDS": "0", "SANDBOX_LATENCY_MS": "100"},
        },
        format="json",
    )
    assert answer.status_code == 201, answer.json()
    created = answer.json()
    url = f"/api/v1/services/{created['id']}"
    service = Service.objects.get(pk=created["id"])
    made = api.post(f"{url}/tokens", {"name": "app"}, format="json")
    assert made.status_code == 201, made.json()
    auth = {"Authorization": f"Bearer {made.json()['token']}"}
    passes_until(service, lambda s: s.status == ServiceStatus.READY and ready_count(s) == 2)
    shown = api.get(url).json()
    assert (shown["status"], shown["ready_replicas"], shown["revision"]) == ("ready", 2, 1)

    # Called at its endpoint URL with the token (and refused without it).
    endpoint = urlsplit(shown["endpoint_url"]).path + "v1/models"
    assert cluster_gateway.get(endpoint).status_code == 401
    assert cluster_gateway.get(endpoint, headers=auth).status_code == 200
    base = str(cluster_gateway.base_url)

    # Load: about eight requests in flight against a target of two per replica.
    load = Traffic(base, endpoint, auth, threads=8)
    try:
        most = passes_until(service, lambda s: ready_count(s) >= 3)
    finally:
        statuses = load.stop()
    assert set(statuses) == {"200"}, (statuses, load.failures)
    # Back down to its minimum once the load is gone, drained first.
    most = max(most, passes_until(service, lambda s: serving(s) == 2 and s.desired_replicas == 2))
    assert most <= 4  # never above max_replicas
    events = service.scale_events.order_by("at", "pk")
    assert any(e.from_replicas == 2 and e.to_replicas >= 3 for e in events)
    assert any(e.to_replicas == 2 and e.from_replicas >= 3 for e in events)

    # To zero, and called again: held at the gateway while the first replica starts.
    scaled = api.post(f"{url}/scale", {"min_replicas": 0, "max_replicas": 4}, format="json")
    assert scaled.status_code == 200, scaled.json()
    passes_until(service, lambda s: s.status == ServiceStatus.SCALED_TO_ZERO and serving(s) == 0)
    assert api.get(url).json()["status"] == "scaled_to_zero"
    with ThreadPoolExecutor(1) as pool:
        woken = pool.submit(cluster_gateway.get, endpoint, headers=auth)
        passes_until(service, lambda s: woken.done())
        assert woken.result().status_code == 200, woken.result().text
    assert service.scale_events.filter(window=ScaleWindow.COLD_START, to_replicas=1).exists()

    # A new revision rolled out under load, then rolled back: no request fails.
    load = Traffic(base, endpoint, auth, threads=2)
    try:
        env = {**created["env"], "MODEL": "v2"}
        changed = api.patch(url, {"env": env}, format="json")
        assert changed.status_code == 200 and changed.json()["revision"] == 2, changed.json()
        most = passes_until(service, rolled_to(2))
        back = api.post(f"{url}/rollback", {"revision": 1}, format="json")
        assert back.status_code == 200 and back.json()["revision"] == 3, back.json()
        most = max(most, passes_until(service, rolled_to(3)))
    finally:
        statuses = load.stop()
    assert set(statuses) == {"200"} and statuses["200"] > 10, (statuses, load.failures)
    assert most <= 5  # max_replicas + 1
    revisions = api.get(f"{url}/revisions").json()
    assert [r["number"] for r in revisions][:3] in ([3, 2, 1], [1, 2, 3])

    # Its cost: metered per GPU-hour, on the Cost Explorer and the invoice.
    meter_tick(now=timezone.now())
    today = timezone.localdate().isoformat()
    usage = token_client(world.viewer, world.tenant).get(
        "/api/v1/usage", {"start": today, "end": today, "group_by": "tier"}
    )
    (row,) = [r for r in usage.json()["results"] if r["key"] == SERVICE_TIER]
    assert Decimal(row["amount"]) > 0
    page = signed_in_client(world.owner, world.tenant).get(reverse("billing:costs"))
    assert page.status_code == 200 and b"Services" in page.content
    now = timezone.now()
    month = datetime(now.year, now.month, 1, tzinfo=UTC)
    following = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
    invoice = invoice_finalize(
        invoice=invoice_draft_create(tenant=world.tenant, period_start=month, period_end=following),
        user=None,
    )
    line = invoice.lines.get(tier=SERVICE_TIER)
    assert line.description == "H100 80GB SXM · service replicas · us-west"
    assert line.unit == "GPU-hour" and line.amount == Decimal(row["amount"])
