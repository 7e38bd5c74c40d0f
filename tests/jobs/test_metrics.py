"""GPU metrics: collection (Prometheus/DCGM through a real Prometheus server; NVML),
storage and downsampling, the API with its server-built figures, and live publishing.

The Prometheus test starts Debian's `prometheus` binary on a free loopback port, scraping
a small exporter that serves DCGM-format metrics for our jobs' pods; where the binary is
missing it is skipped with the reason (CI installs it)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.urls import include, path, re_path
from django.utils import timezone

from console.launcher import free_loopback_port
from jobs import gpu_readings, metrics
from jobs.api import streams
from jobs.backends.base import GpuReading
from jobs.backends.local import NOTE_NO_NVML
from jobs.models import JobMetricSample, JobStatus, MetricResolution
from tests.conftest import signed_in_client
from tests.jobs.test_consumers import (
    TIMEOUT,
    communicator,
    make_job,
    run,
    session_cookie,
)

urlpatterns = [
    re_path(r"^api/v1/jobs/(?P<pk>\d+)/metrics/?$", streams.JobMetricsView.as_view()),
    re_path(r"^api/v1/jobs/(?P<pk>\d+)/monitor/?$", streams.JobMonitorView.as_view()),
    path("", include("console.urls")),
]

PROMETHEUS = shutil.which("prometheus")


def reading(**values) -> GpuReading:
    base = {"node": "rank 0", "gpu": 0, "utilization": 50.0, "memory_used_mib": 1000.0}
    return GpuReading(**{**base, **values})


# --- notes, API, figures --------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls("tests.jobs.test_metrics")
def test_api_returns_samples_figures_and_why_there_are_none(world, other_world, catalog):
    cpu_job = make_job(world.tenant, name="cpu only")
    gpu_job = make_job(world.tenant, name="gpu", gpus_per_node=2, backend="kubernetes")
    now = timezone.now()
    metrics.metrics_record(
        job=gpu_job,
        at=now - timedelta(minutes=1),
        readings=[reading(gpu=0, utilization=40), reading(gpu=1, utilization=60)],
    )
    metrics.metrics_record(job=gpu_job, at=now, readings=[reading(gpu=0, utilization=80)])
    client = signed_in_client(world.viewer, world.tenant)

    body = client.get(f"/api/v1/jobs/{cpu_job.pk}/metrics").json()
    assert body["samples"] == [] and body["note"] == "no GPU"

    body = client.get(f"/api/v1/jobs/{gpu_job.pk}/metrics").json()
    assert [(s["gpu"], s["utilization"]) for s in body["samples"]] == [(0, 40), (1, 60), (0, 80)]
    assert body["summary"]["mean_utilization"] == 60.0
    figure = body["figures"]["utilization"]
    assert [(t["meta"], t["y"]) for t in figure["data"]] == [
        ("rank 0/gpu0", [40, 80]),
        ("rank 0/gpu1", [60]),
    ]
    since = (now - timedelta(seconds=30)).isoformat()
    recent = client.get(f"/api/v1/jobs/{gpu_job.pk}/metrics", {"since": since}).json()
    assert [s["utilization"] for s in recent["samples"]] == [80]
    assert client.get(f"/api/v1/jobs/{gpu_job.pk}/metrics?since=yesterday").status_code == 400
    outsider = signed_in_client(other_world.owner, other_world.tenant)
    assert outsider.get(f"/api/v1/jobs/{gpu_job.pk}/metrics").status_code == 404


@pytest.mark.django_db
@pytest.mark.urls("tests.jobs.test_metrics")
def test_auto_stop_setting_needs_the_launch_capability(world, catalog):
    # The member's own job: setting what pauses it is an action on it (only one's own).
    job = make_job(world.tenant, gpus_per_node=1, created_by=world.member)
    url = f"/api/v1/jobs/{job.pk}/monitor"
    viewer = signed_in_client(world.viewer, world.tenant)
    in_effect = {"loss_explosion_pause": True, "hardware_repair": True}  # the defaults
    assert viewer.get(url).json() == {
        "idle_auto_stop": False,
        "idle_minutes": None,
        "loss_explosion_pause": None,
        "hardware_repair": None,
        "in_effect": in_effect,
    }
    change = {"idle_auto_stop": True, "idle_minutes": 20, "loss_explosion_pause": False}
    assert viewer.put(url, change, content_type="application/json").status_code == 403
    member = signed_in_client(world.member, world.tenant)
    response = member.put(url, change, content_type="application/json")
    chosen = {
        **change,
        "hardware_repair": None,
        "in_effect": {**in_effect, "loss_explosion_pause": False},
    }
    assert response.status_code == 200 and response.json() == chosen
    assert member.get(url).json() == chosen
    # Left out, the loss choice stays as it was.
    again = {"idle_auto_stop": False, "idle_minutes": None}
    answer = member.put(url, again, content_type="application/json").json()
    assert answer == {**chosen, **again}


@pytest.mark.django_db
def test_local_gpu_job_without_nvml_says_so(world, catalog, monkeypatch):
    job = make_job(world.tenant, gpus_per_node=1, assigned_devices=[0])
    monkeypatch.setattr(gpu_readings, "nvml_readings", lambda devices: None)
    assert metrics.metrics_note(job) == NOTE_NO_NVML
    assert metrics.metrics_collect() == 0


@pytest.mark.django_db
def test_nvml_readings_become_samples(world, catalog, monkeypatch):
    """The NVML calls are faked here (no GPU on this machine); the mapping is what's tested."""
    import pynvml

    class Utilization:
        gpu = 73

    class Memory:
        used, total = 40 * 2**30, 80 * 2**30

    calls = []
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: calls.append(i) or i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: Utilization)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: Memory)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda h: 312_500)

    def no_temperature(handle, sensor):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", no_temperature)
    job = make_job(world.tenant, gpus_per_node=2, assigned_devices=[2, 3])
    assert metrics.metrics_collect() == 2
    assert calls == [2, 3]
    sample = JobMetricSample.objects.filter(job=job).order_by("gpu").first()
    assert (sample.gpu, sample.utilization, sample.memory_used_mib, sample.memory_total_mib) == (
        2,
        73.0,
        40 * 1024,
        80 * 1024,
    )
    assert sample.power_w == 312.5 and sample.temperature_c is None


# --- downsampling ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_raw_samples_older_than_an_hour_become_minute_means(world, catalog):
    job = make_job(world.tenant, gpus_per_node=1)
    now = timezone.now().replace(second=30, microsecond=0)
    old_minute = (now - timedelta(hours=2)).replace(second=0)
    for second, value in ((5, 10.0), (25, 20.0), (45, 60.0)):
        metrics.metrics_record(
            job=job,
            at=old_minute + timedelta(seconds=second),
            readings=[reading(utilization=value, power_w=None)],
        )
    metrics.metrics_record(job=job, at=now - timedelta(minutes=5), readings=[reading()])
    assert metrics.metrics_downsample(now=now) == 3
    assert metrics.metrics_downsample(now=now) == 0
    rows = list(JobMetricSample.objects.filter(job=job).order_by("at"))
    assert [(r.resolution, r.at, r.utilization, r.power_w) for r in rows] == [
        (MetricResolution.MINUTE, old_minute, 30.0, None),
        (MetricResolution.RAW, now - timedelta(minutes=5), 50.0, None),
    ]


# --- live ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_new_samples_reach_the_job_socket_and_a_summary_the_tenant_socket(world, catalog):
    job = make_job(world.tenant, gpus_per_node=2)
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        import asyncio

        from channels.db import database_sync_to_async

        job_socket = communicator(f"/ws/jobs/{job.pk}/", cookie=cookie)
        tenant_socket = communicator("/ws/tenant/", cookie=cookie)
        assert (await job_socket.connect(timeout=TIMEOUT))[0]
        assert (await tenant_socket.connect(timeout=TIMEOUT))[0]
        await asyncio.sleep(0.3)
        await database_sync_to_async(metrics.metrics_record)(
            job=job,
            at=timezone.now(),
            readings=[reading(gpu=0, utilization=20), reading(gpu=1, utilization=60)],
        )
        while (message := await job_socket.receive_json_from(timeout=TIMEOUT))["type"] != "metrics":
            pass
        summary = await tenant_socket.receive_json_from(timeout=TIMEOUT)
        await job_socket.disconnect()
        await tenant_socket.disconnect()
        return message, summary

    message, summary = run(body)
    assert [(s["gpu"], s["utilization"]) for s in message["samples"]] == [(0, 20), (1, 60)]
    assert (summary["type"], summary["job_id"], summary["utilization"]) == ("metrics", job.pk, 40)


# --- Prometheus (DCGM exporter) -------------------------------------------------------------------


class DcgmExporter:
    """Serves DCGM exporter metrics (text format) for the pods it is told about."""

    def __init__(self):
        self.series: list[tuple[str, dict[str, str], float]] = []
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                lines = []
                for name, labels, value in exporter.series:
                    rendered = ",".join(f'{k}="{v}"' for k, v in labels.items())
                    lines.append(f"{name}{{{rendered}}} {value}")
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def gpu(self, pod: str, gpu: int, *, util, used, free, power, temp, host="node-1"):
        labels = {
            "gpu": str(gpu),
            "UUID": f"GPU-{pod}-{gpu}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": host,
            "namespace": "gg-t-1",
            "pod": pod,
            "container": "main",
        }
        for name, value in (
            ("DCGM_FI_DEV_GPU_UTIL", util),
            ("DCGM_FI_DEV_FB_USED", used),
            ("DCGM_FI_DEV_FB_FREE", free),
            ("DCGM_FI_DEV_POWER_USAGE", power),
            ("DCGM_FI_DEV_GPU_TEMP", temp),
        ):
            self.series.append((name, labels, value))


@pytest.fixture
def prometheus(tmp_path):
    if PROMETHEUS is None:
        pytest.skip(
            "the prometheus binary is missing: this test runs Debian's `prometheus` "
            "(CI installs it with `apt-get install --no-install-recommends prometheus`)"
        )
    exporter = DcgmExporter()
    port = free_loopback_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: dcgm\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exporter.port}']\n"
    )
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("wb"),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError((tmp_path / "prometheus.log").read_text()[-3000:])
        exporter.url = url
        yield exporter
    finally:
        process.terminate()
        process.wait(timeout=10)
        exporter.server.shutdown()


@pytest.mark.django_db
def test_kubernetes_jobs_metrics_come_from_one_prometheus_query_per_tick(
    world, catalog, prometheus, settings, monkeypatch
):
    two_node = make_job(
        world.tenant,
        name="two nodes",
        backend="kubernetes",
        gpus_per_node=2,
        nodes=2,
        on_demand_nodes=1,
        spot_nodes=1,
    )
    one_node = make_job(world.tenant, name="one node", backend="kubernetes", gpus_per_node=1)
    finished = make_job(
        world.tenant, name="done", backend="kubernetes", gpus_per_node=1, status=JobStatus.FAILED
    )
    values = {"used": 30000, "free": 51000, "power": 400.5, "temp": 61}
    prometheus.gpu(f"gg-{two_node.pk}-a1-0-x1b2c", 0, util=90, **values)
    prometheus.gpu(f"gg-{two_node.pk}-a1-0-x1b2c", 1, util=91, **values)
    prometheus.gpu(f"gg-{two_node.pk}-a1-spot-0-q9w8e", 0, util=80, **values)
    prometheus.gpu(f"gg-{two_node.pk}-a1-spot-0-q9w8e", 1, util=81, **values)
    prometheus.gpu(f"gg-{one_node.pk}-a1-0-zzzzz", 0, util=12, **values)
    prometheus.gpu(f"gg-{one_node.pk}-a0-0-old00", 0, util=99, **values)  # an old attempt
    prometheus.gpu(f"gg-{finished.pk}-a1-0-fffff", 0, util=99, **values)
    prometheus.gpu("someone-elses-pod-0", 0, util=99, **values)
    settings.PROMETHEUS_URL = prometheus.url
    # No cluster here: the loss scan of these Kubernetes jobs finds no pods, quietly.
    monkeypatch.setattr("jobs.logs.reading.spool_sync", lambda job, backend: 0)

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # until Prometheus has scraped the exporter
        query = {"query": gpu_readings.dcgm_query()}
        answer = httpx.get(f"{prometheus.url}/api/v1/query", params=query)
        if len(answer.json()["data"]["result"]) >= 35:
            break
        time.sleep(0.3)
    queries = []
    real_get = httpx.get
    monkeypatch.setattr(
        gpu_readings.httpx, "get", lambda *a, **k: queries.append(k["params"]) or real_get(*a, **k)
    )
    assert metrics.metrics_collect() == 5
    assert len(queries) == 1

    rows = {
        (s.job_id, s.node, s.gpu): s
        for s in JobMetricSample.objects.filter(job__in=[two_node, one_node, finished])
    }
    assert sorted((job_id, node, gpu) for job_id, node, gpu in rows) == sorted(
        [
            (two_node.pk, "rank 0", 0),
            (two_node.pk, "rank 0", 1),
            (two_node.pk, "rank 1", 0),
            (two_node.pk, "rank 1", 1),
            (one_node.pk, "rank 0", 0),
        ]
    )
    spot_gpu = rows[(two_node.pk, "rank 1", 1)]
    assert (spot_gpu.utilization, spot_gpu.memory_used_mib, spot_gpu.memory_total_mib) == (
        81,
        30000,
        81000,
    )
    assert (spot_gpu.power_w, spot_gpu.temperature_c) == (400.5, 61)
    assert rows[(one_node.pk, "rank 0", 0)].utilization == 12
