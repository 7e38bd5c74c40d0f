"""Issue 17, "Prometheus metrics": /metrics answers only the METRICS_TOKEN bearer (a 404
without the setting), is never cached, and exposes HTTP, jobs, queue, metering, Celery
and WebSocket metrics. tests/integration/test_prometheus_scrape.py has a real Prometheus
scrape it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from celery import signals
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from billing.models import JobMeter
from console import health, metrics
from console.launcher import free_loopback_port
from jobs.models import JobStatus
from tests.factories import JobFactory, NodePoolFactory

TOKEN = "metrics-test-token-0123456789"


def scrape(client: Client | None = None) -> dict[tuple[str, frozenset], float]:
    response = (client or Client()).get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content[:500]
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def token(settings):
    settings.METRICS_TOKEN = TOKEN


@pytest.mark.django_db
def test_without_a_configured_token_metrics_is_a_404(settings):
    settings.METRICS_TOKEN = ""

    assert Client().get("/metrics").status_code == 404
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer anything").status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize(
    "header", ["", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", TOKEN, "Bearer "]
)
def test_a_wrong_or_missing_token_gets_401(token, header):
    response = Client().get("/metrics", HTTP_AUTHORIZATION=header)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"gpugeek_" not in response.content


@pytest.mark.django_db
def test_the_exposition_format_and_never_cached(token):
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    assert "no-cache" in response["Cache-Control"]
    assert "max-age=0" in response["Cache-Control"]
    body = response.content.decode()
    for name in (
        "gpugeek_http_requests_total",
        "gpugeek_http_request_duration_seconds_bucket",
        "gpugeek_jobs",
        "gpugeek_metering_lag_seconds",
        "gpugeek_open_meters",
    ):
        assert f"\n{name}" in body or body.startswith(name), name


@pytest.mark.django_db
def test_http_requests_are_counted_by_view_name_and_status(token):
    before = scrape()
    client = Client()
    for _ in range(3):
        assert client.get("/healthz").status_code == 200
    assert client.get("/no/such/page/").status_code == 404

    after = scrape()

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("gpugeek_http_requests_total", view="healthz", method="GET", status="200") == 3
    assert delta("gpugeek_http_requests_total", view="unmatched", method="GET", status="404") == 1
    assert delta("gpugeek_http_request_duration_seconds_count", view="healthz") == 3
    assert value(after, "gpugeek_http_request_duration_seconds_sum", view="healthz") > 0


@pytest.mark.django_db
def test_jobs_by_status_and_queue_depth_per_pool(token):
    pool = NodePoolFactory()
    old = timezone.now() - timedelta(minutes=10)
    JobFactory(pool=pool, status_changed_at=old)
    JobFactory(pool=pool)
    JobFactory(pool=pool)

    samples = scrape()

    assert value(samples, "gpugeek_jobs", status="queued") == 3
    assert value(samples, "gpugeek_jobs", status="running") == 0
    assert {
        status
        for (name, labels), _ in samples.items()
        if name == "gpugeek_jobs"
        for _, status in labels
    } == set(JobStatus.values)
    assert value(samples, "gpugeek_queue_depth", pool=pool.slug) == 3
    wait = value(samples, "gpugeek_queue_oldest_wait_seconds", pool=pool.slug)
    assert 590 < wait < 700


@pytest.mark.django_db
def test_metering_lag_is_now_minus_the_oldest_open_meter(token):
    assert value(scrape(), "gpugeek_metering_lag_seconds") == 0
    now = timezone.now()
    JobMeter.objects.create(job=JobFactory(), metered_until=now - timedelta(seconds=90))
    JobMeter.objects.create(job=JobFactory(), metered_until=now - timedelta(seconds=30))
    JobMeter.objects.create(job=JobFactory(), metered_until=now - timedelta(hours=5), open=False)

    samples = scrape()

    assert 89 < value(samples, "gpugeek_metering_lag_seconds") < 150
    assert value(samples, "gpugeek_open_meters") == 2


@pytest.mark.django_db
def test_a_failing_collector_does_not_hide_the_others(token, monkeypatch):
    class Broken:
        def collect(self):
            raise RuntimeError("boom")

    monkeypatch.setitem(metrics._scrape_collectors, "broken", Broken())

    assert "gpugeek_jobs" in {name for name, _ in scrape()}


class FakeTask:
    name = "tests.fake_task"


@pytest.mark.django_db
def test_celery_task_outcomes_and_durations_are_counted(token):
    before = scrape()
    task = FakeTask()
    signals.task_prerun.send(sender=task, task_id="t1", task=task)
    signals.task_success.send(sender=task, result=None)
    signals.task_postrun.send(sender=task, task_id="t1", task=task)
    signals.task_failure.send(sender=task, task_id="t2", exception=RuntimeError())
    signals.task_retry.send(sender=task, request=None, reason="later")
    signals.task_retry.send(sender=task, request=None, reason="later")

    after = scrape()

    def delta(outcome):
        name = "gpugeek_celery_tasks_total"
        return value(after, name, task=task.name, outcome=outcome) - value(
            before, name, task=task.name, outcome=outcome
        )

    assert (delta("success"), delta("failure"), delta("retry")) == (1, 1, 2)
    assert value(after, "gpugeek_celery_task_duration_seconds_count", task=task.name) >= 1
    assert ("gpugeek_celery_task_last_duration_seconds", frozenset({("task", task.name)})) in after


def test_websocket_connections_are_counted_while_open():
    gauge = metrics.WEBSOCKET_CONNECTIONS.labels("jobs")
    seen = []

    async def app(scope, receive, send):
        await send({"type": "websocket.accept"})
        seen.append(gauge._value.get())
        await send({"type": "websocket.close"})

    async def refusing(scope, receive, send):
        await send({"type": "websocket.close"})

    async def nothing(message):
        return None

    start = gauge._value.get()
    scope = {"type": "websocket", "path": "/ws/jobs/12/"}
    asyncio.run(metrics.WebsocketMetrics(app)(scope, None, nothing))
    asyncio.run(metrics.WebsocketMetrics(refusing)(scope, None, nothing))

    assert seen == [start + 1]
    assert gauge._value.get() == start


@pytest.mark.django_db
def test_readyz_checks_the_database_and_redis(monkeypatch):
    response = Client().get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]

    monkeypatch.setattr(health, "_check_redis", lambda: {"status": "error", "error": "x"})
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "error"}


def test_the_multiprocess_directory_starts_empty(tmp_path):
    directory = tmp_path / "prometheus"
    assert metrics.multiprocess_dir_reset(directory) == directory
    (directory / "counter_123.db").write_bytes(b"old")
    (directory / "keep.txt").write_text("not ours")

    metrics.multiprocess_dir_reset(str(directory))

    assert sorted(p.name for p in directory.iterdir()) == ["keep.txt"]


def test_a_worker_serves_its_counters_with_the_same_token(settings, request):
    import httpx

    settings.METRICS_TOKEN = TOKEN
    port = free_loopback_port()
    server = metrics.counted_metrics_serve(port)
    request.addfinalizer(server.shutdown)
    url = f"http://127.0.0.1:{port}"

    assert httpx.get(f"{url}/metrics", timeout=5).status_code == 401
    assert httpx.get(f"{url}/other", timeout=5).status_code == 404
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    assert "gpugeek_celery_tasks_total" in response.text or "gpugeek_http" in response.text
    assert "gpugeek_jobs" not in response.text  # the web pods report the database gauges
    settings.METRICS_TOKEN = ""
    assert httpx.get(f"{url}/metrics", timeout=5).status_code == 404
