"""Issue 17: a real Prometheus (Debian's `prometheus` binary, as in
tests/jobs/test_metrics.py) scrapes the console's /metrics through uvicorn with the
METRICS_TOKEN bearer, in multiprocess mode (PROMETHEUS_MULTIPROC_DIR), and its HTTP API
answers `gpugeek_jobs{status="queued"}` with the jobs in the database."""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest

from billing import tasks as billing_tasks
from console.launcher import free_loopback_port
from console.queueing import enqueue_now
from tests.factories import JobFactory, NodePoolFactory
from tests.servers import wait_until, watcher_process  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus")
TOKEN = "scrape-test-token-0123456789"


@pytest.fixture
def console_server(transactional_db, request, monkeypatch, tmp_path):
    """The asgi_server fixture, started with METRICS_TOKEN and a multiprocess directory."""
    multiproc = tmp_path / "prometheus-multiproc"
    multiproc.mkdir()
    monkeypatch.setenv("METRICS_TOKEN", TOKEN)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(multiproc))
    server = request.getfixturevalue("asgi_server")
    return server, multiproc


def scrape_text(server) -> str:
    response = httpx.get(
        f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert response.status_code == 200, server.log()
    return response.text


@pytest.fixture
def prometheus_for(tmp_path):
    if PROMETHEUS is None:
        pytest.skip(
            "the prometheus binary is missing: this test runs Debian's `prometheus` "
            "(CI installs it with `apt-get install --no-install-recommends prometheus`)"
        )
    processes = []

    def start(target: str) -> str:
        port = free_loopback_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: gpugeek\n    metrics_path: /metrics\n"
            f"    authorization:\n      type: Bearer\n      credentials: {TOKEN}\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        log = tmp_path / "prometheus.log"
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
            start_new_session=True,
        )
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(log.read_text()[-3000:])

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=10)


def query(prometheus: str, promql: str) -> list[dict]:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5)
    answer.raise_for_status()
    return answer.json()["data"]["result"]


def test_a_real_prometheus_scrapes_the_console(console_server, prometheus_for):
    server, multiproc = console_server
    pool = NodePoolFactory()
    for _ in range(4):
        JobFactory(pool=pool)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.get("/metrics").status_code == 401
        for _ in range(2):
            assert client.get("/healthz").status_code == 200, server.log()

    prometheus = prometheus_for(f"127.0.0.1:{server.port}")

    def scraped():
        up = query(prometheus, 'up{job="gpugeek"}')
        return up and up[0]["value"][1] == "1" and query(prometheus, "gpugeek_jobs")

    wait_until(scraped, 30, what="Prometheus to scrape /metrics")
    queued = query(prometheus, 'gpugeek_jobs{status="queued"}')
    assert [float(row["value"][1]) for row in queued] == [4]
    depth = query(prometheus, f'gpugeek_queue_depth{{pool="{pool.slug}"}}')
    assert [float(row["value"][1]) for row in depth] == [4]
    healthz = query(
        prometheus, 'gpugeek_http_requests_total{view="healthz",method="GET",status="200"}'
    )
    assert healthz and float(healthz[0]["value"][1]) >= 2

    def scrapes_counted():  # a scrape is counted after it answers: seen by the next one
        rows = query(prometheus, 'gpugeek_http_requests_total{view="metrics"}')
        return {row["metric"]["status"] for row in rows} >= {"200", "401"}

    wait_until(scrapes_counted, 15, what="the scrapes themselves to be counted")
    assert query(prometheus, "gpugeek_metering_lag_seconds")
    # Multiprocess mode: the web server process wrote its counters to files there.
    assert any(multiproc.glob("*.db")), server.log()


def test_the_web_process_reports_what_the_worker_process_counted(console_server, request):
    """Multiprocess mode: a task run by the Celery worker (another process, the same
    PROMETHEUS_MULTIPROC_DIR) is in the web process's /metrics."""

    server, multiproc = console_server
    worker = request.getfixturevalue("celery_worker_process")
    line = 'gpugeek_celery_tasks_total{outcome="success",task="billing.tasks.meter_tick_task"}'
    assert line not in scrape_text(server)

    assert enqueue_now(billing_tasks.meter_tick_task)

    wait_until(lambda: line in scrape_text(server), 30, what=f"{line} in /metrics")
    text = scrape_text(server)
    assert 'gpugeek_celery_task_last_duration_seconds{task="billing.tasks.meter_tick_task"}' in text
    assert len({p.name.rsplit("_", 1)[-1] for p in multiproc.glob("*.db")}) >= 2, worker.log()


def test_the_web_process_reports_the_watchers_passes(console_server, request):
    """As `runconsole` runs them: the watcher shares the multiprocess directory, so its
    passes are in the web process's /metrics (in its own pod it serves them itself, see
    tests/jobs/test_metrics_prometheus.py)."""
    server, _ = console_server
    request.getfixturevalue("watcher_process")
    line = 'gpugeek_watcher_pass_duration_seconds_count{kind="full"}'

    wait_until(lambda: line in scrape_text(server), 30, what=f"{line} in /metrics")
    assert 'gpugeek_watcher_last_pass_timestamp_seconds{kind="full"}' in scrape_text(server)
