"""Issue 17, the jobs figures counted where things happen (/metrics itself is tested in
tests/console/test_prometheus_metrics.py): dispatch latency from a real dispatch on the
local backend, and `manage.py run_watcher` serving its own counters on
METRICS_WORKER_PORT. The watch's events are counted in
tests/jobs/test_kubernetes_lifecycle.py, against the fake Kubernetes API."""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from console.launcher import free_loopback_port
from jobs import services
from jobs.backends.local import LocalBackend
from jobs.models import JobStatus
from jobs.state import job_retry_note
from tests.console.test_prometheus_metrics import TOKEN, scrape, value
from tests.jobs_helpers import at_time, submit
from tests.servers import child_env, started_child, wait_until

LATENCY = "gpugeek_dispatch_latency_seconds"


@pytest.mark.parametrize("retried", [False, True])
@pytest.mark.django_db(transaction=True)
def test_dispatch_latency_is_counted_from_admission_even_after_a_retry(
    world, catalog, settings, retried
):
    settings.METRICS_TOKEN = TOKEN
    before = scrape()
    with at_time(timezone.now() - timedelta(seconds=30)):
        job = submit(world, "admitted a while ago")
    assert job.status == JobStatus.DISPATCHING, job.status_reason
    if retried:
        # A retry touches status_changed_at: the latency still counts from admission.
        job_retry_note(job=job, reason="retrying: backend unavailable")

    job = services.job_dispatch(job=job)

    assert job.status == JobStatus.RUNNING, job.status_reason
    after = scrape()
    backend = LocalBackend.name

    def delta(name, **labels):
        return value(after, name, backend=backend, **labels) - value(
            before, name, backend=backend, **labels
        )

    assert delta(f"{LATENCY}_count") == 1
    assert 30 <= delta(f"{LATENCY}_sum") < 60
    assert (delta(f"{LATENCY}_bucket", le="10.0"), delta(f"{LATENCY}_bucket", le="60.0")) == (0, 1)


def served_samples(port: int) -> dict[tuple[str, frozenset], float]:
    response = httpx.get(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
    )
    assert response.status_code == 200, response.text[:500]
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def full_passes(port: int) -> float:
    return value(served_samples(port), "gpugeek_watcher_pass_duration_seconds_count", kind="full")


@pytest.mark.django_db(transaction=True)
def test_the_watcher_serves_its_passes_on_the_worker_metrics_port(tmp_path):
    port = free_loopback_port()
    env = child_env(WATCHER_INTERVAL="1", METRICS_WORKER_PORT=str(port), METRICS_TOKEN=TOKEN)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # its own counters, as in its own pod
    started_at = time.time()
    with started_child(
        [sys.executable, "manage.py", "run_watcher"],
        env,
        tmp_path / "watcher.log",
        ready="watcher started",
        what="watcher started",
    ):
        wait_until(lambda: full_passes(port) >= 2, 20, what="two full watcher passes counted")
        samples = served_samples(port)

    last_pass = value(samples, "gpugeek_watcher_last_pass_timestamp_seconds", kind="full")
    assert started_at < last_pass <= time.time()
    assert value(samples, "gpugeek_watcher_pass_duration_seconds_sum", kind="full") > 0
    assert "gpugeek_jobs" not in {name for name, _ in samples}  # the web reports those
