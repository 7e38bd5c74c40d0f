"""GPU metrics of running jobs: collected every METRICS_INTERVAL seconds by a periodic
task, stored (raw for METRICS_RAW_RETENTION, then 1-minute means), published live.

Sources:
- local backend: NVML (nvidia-ml-py) for the GPU indices assigned to the job; a host
  without a driver has no readings and the page says "no GPU";
- kubernetes: the DCGM exporter's metrics through Prometheus's HTTP API (PROMETHEUS_URL),
  one instant query per tick for every running job (series are matched to jobs by pod
  name `gg-<job>-a<attempt>[-spot]-<index>-…`).
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import fmean

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs import realtime
from jobs.models import Job, JobMetricSample, JobStatus, MetricResolution

log = logging.getLogger(__name__)

DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "utilization",
    "DCGM_FI_DEV_FB_USED": "memory_used_mib",
    "DCGM_FI_DEV_FB_FREE": "memory_free_mib",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
}
# Our pods' names (jobs.backends.kubernetes_manifests.job_name + the Indexed Job suffix).
POD_NAME = re.compile(r"^gg-(?P<job>\d+)-a(?P<attempt>\d+)(?P<spot>-spot)?-(?P<index>\d+)-")
NOTE_NO_GPU = "no GPU"
NOTE_NO_NVML = "no GPU readings: NVML is not available on this host"
NOTE_NO_PROMETHEUS = "no GPU readings: PROMETHEUS_URL is not configured"
SAMPLE_FIELDS = (
    "utilization",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
)


@dataclass(frozen=True)
class GpuReading:
    node: str
    gpu: int
    utilization: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None


def _setting(name: str, default):
    return getattr(settings, name, default)


# --- sources ------------------------------------------------------------------------------


def nvml_readings(devices: list[int]) -> list[GpuReading] | None:
    """Readings of this host's GPUs `devices` (NVML indices); None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    host = socket.gethostname()
    readings = []
    try:
        for index in devices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)

            def read(call, handle=handle):
                try:
                    return call(handle)
                except pynvml.NVMLError:
                    return None  # a field this GPU doesn't report (e.g. power on some)

            utilization = read(pynvml.nvmlDeviceGetUtilizationRates)
            memory = read(pynvml.nvmlDeviceGetMemoryInfo)
            power_mw = read(pynvml.nvmlDeviceGetPowerUsage)
            temperature = read(
                lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            )
            readings.append(
                GpuReading(
                    node=host,
                    gpu=index,
                    utilization=float(utilization.gpu) if utilization is not None else None,
                    memory_used_mib=memory.used / 2**20 if memory is not None else None,
                    memory_total_mib=memory.total / 2**20 if memory is not None else None,
                    power_w=power_mw / 1000.0 if power_mw is not None else None,
                    temperature_c=float(temperature) if temperature is not None else None,
                )
            )
    finally:
        pynvml.nvmlShutdown()
    return readings


def dcgm_query() -> str:
    """One PromQL instant query for every DCGM field of every pod of ours. Exporters
    scraped through a ServiceMonitor carry the workload's pod as `exported_pod`."""
    names = "|".join(DCGM_FIELDS)
    return (
        f'{{__name__=~"{names}",pod=~"gg-[0-9]+-a.+"}} or '
        f'{{__name__=~"{names}",exported_pod=~"gg-[0-9]+-a.+"}}'
    )


def prometheus_readings(
    jobs: list[Job], *, url: str, timeout: float = 5.0
) -> dict[int, list[GpuReading]]:
    """Readings of the running Kubernetes `jobs`, from one Prometheus query.

    Raises httpx.HTTPError when Prometheus can't be reached or answers an error."""
    wanted = {job.pk: job for job in jobs}
    response = httpx.get(
        f"{url.rstrip('/')}/api/v1/query", params={"query": dcgm_query()}, timeout=timeout
    )
    response.raise_for_status()
    body = response.json()
    if body.get("status") != "success":
        raise httpx.HTTPError(f"Prometheus query failed: {body.get('error', body)}")
    values: dict[tuple[int, str, int], dict[str, float]] = defaultdict(dict)
    for series in body["data"]["result"]:
        labels = series["metric"]
        pod = labels.get("exported_pod") or labels.get("pod") or ""
        match = POD_NAME.match(pod)
        if match is None:
            continue
        job = wanted.get(int(match["job"]))
        if job is None or int(match["attempt"]) != job.attempt:
            continue
        rank = int(match["index"]) + (job.on_demand_nodes if match["spot"] else 0)
        try:
            gpu = int(labels.get("gpu", 0))
            value = float(series["value"][1])
        except (TypeError, ValueError):
            continue
        field = DCGM_FIELDS.get(labels.get("__name__", ""))
        if field:
            values[(job.pk, f"rank {rank}", gpu)][field] = value
    readings: dict[int, list[GpuReading]] = defaultdict(list)
    for (job_id, node, gpu), fields in sorted(values.items()):
        used, free = fields.get("memory_used_mib"), fields.get("memory_free_mib")
        readings[job_id].append(
            GpuReading(
                node=node,
                gpu=gpu,
                utilization=fields.get("utilization"),
                memory_used_mib=used,
                memory_total_mib=used + free if used is not None and free is not None else None,
                power_w=fields.get("power_w"),
                temperature_c=fields.get("temperature_c"),
            )
        )
    return readings


# --- collection -------------------------------------------------------------------------------


def metrics_note(job: Job) -> str:
    """Why a job has no GPU readings ("" when it should have some)."""
    if not job.gpus_per_node:
        return NOTE_NO_GPU
    if job.backend == "local":
        return "" if nvml_readings([]) is not None else NOTE_NO_NVML
    if not _setting("PROMETHEUS_URL", ""):
        return NOTE_NO_PROMETHEUS
    return ""


def sample_payload(sample: JobMetricSample) -> realtime.MetricSamplePayload:
    return realtime.MetricSamplePayload(
        at=sample.at.isoformat(),
        node=sample.node,
        gpu=sample.gpu,
        utilization=sample.utilization,
        memory_used_mib=sample.memory_used_mib,
        memory_total_mib=sample.memory_total_mib,
        power_w=sample.power_w,
        temperature_c=sample.temperature_c,
    )


def metrics_record(*, job: Job, readings: list[GpuReading], at: datetime) -> list[JobMetricSample]:
    """Store one tick's readings of a job and publish them."""
    samples = JobMetricSample.objects.bulk_create(
        [
            JobMetricSample(
                job=job,
                at=at,
                node=r.node,
                gpu=r.gpu,
                utilization=r.utilization,
                memory_used_mib=r.memory_used_mib,
                memory_total_mib=r.memory_total_mib,
                power_w=r.power_w,
                temperature_c=r.temperature_c,
            )
            for r in readings
        ]
    )
    realtime.publish_job_metrics(job.pk, job.tenant_id, [sample_payload(s) for s in samples])
    return samples


def metrics_collect(*, now: datetime | None = None) -> int:
    """One collection tick over every running GPU job; returns how many samples were
    stored. Then the alert rules look at each job (jobs.alerts)."""
    from jobs import alerts

    now = now or timezone.now()
    running = list(Job.objects.filter(status=JobStatus.RUNNING).select_related("tenant"))
    by_job: dict[int, list[GpuReading]] = {}
    local = [j for j in running if j.backend == "local" and j.gpus_per_node and j.assigned_devices]
    for job in local:
        readings = nvml_readings([int(i) for i in job.assigned_devices])
        if readings:
            by_job[job.pk] = readings
    remote = [j for j in running if j.backend != "local" and j.gpus_per_node]
    url = _setting("PROMETHEUS_URL", "")
    if remote and url:
        try:
            by_job.update(prometheus_readings(remote, url=url))
        except (httpx.HTTPError, ValueError, KeyError) as error:
            log.warning("reading GPU metrics from Prometheus failed: %s", error)
    stored = 0
    for job in running:
        readings = by_job.get(job.pk)
        if readings:
            stored += len(metrics_record(job=job, readings=readings, at=now))
        try:
            alerts.alerts_evaluate(job=job, now=now)
        except Exception:
            log.exception("evaluating the alert rules of job %s failed", job.pk)
    return stored


# --- retention ----------------------------------------------------------------------------------


def metrics_downsample(*, now: datetime | None = None, batch: int = 20000) -> int:
    """Replace raw samples older than the raw retention by their 1-minute means (per job,
    node and GPU). Safe to run twice: a minute already averaged is merged, not doubled."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=_setting("METRICS_RAW_RETENTION", 3600))
    cutoff = cutoff.replace(second=0, microsecond=0)  # whole minutes only
    raw = list(
        JobMetricSample.objects.filter(resolution=MetricResolution.RAW, at__lt=cutoff).order_by(
            "at"
        )[:batch]
    )
    if not raw:
        return 0
    buckets: dict[tuple[int, str, int, datetime], list[JobMetricSample]] = defaultdict(list)
    for sample in raw:
        minute = sample.at.replace(second=0, microsecond=0)
        buckets[(sample.job_id, sample.node, sample.gpu, minute)].append(sample)
    with transaction.atomic():
        for (job_id, node, gpu, minute), samples in buckets.items():
            existing = JobMetricSample.objects.filter(
                job_id=job_id, node=node, gpu=gpu, at=minute, resolution=MetricResolution.MINUTE
            ).first()
            means = {field: _mean(samples, field) for field in SAMPLE_FIELDS}
            if existing is None:
                JobMetricSample.objects.create(
                    job_id=job_id,
                    node=node,
                    gpu=gpu,
                    at=minute,
                    resolution=MetricResolution.MINUTE,
                    **means,
                )
            else:  # a later batch of the same minute: fold in (weights are close enough)
                for field, value in means.items():
                    old = getattr(existing, field)
                    setattr(existing, field, value if old is None else _fmean_pair(old, value))
                existing.save()
        JobMetricSample.objects.filter(pk__in=[s.pk for s in raw]).delete()
    return len(raw)


def _mean(samples: list[JobMetricSample], field: str) -> float | None:
    values = [getattr(s, field) for s in samples if getattr(s, field) is not None]
    return fmean(values) if values else None


def _fmean_pair(a: float, b: float | None) -> float:
    return a if b is None else (a + b) / 2


# --- reading (API, page) ------------------------------------------------------------------------


def job_samples(*, job: Job, since: datetime | None = None, limit: int = 20000) -> list[dict]:
    samples = JobMetricSample.objects.filter(job=job)
    if since is not None:
        samples = samples.filter(at__gte=since)
    rows = samples.order_by("at", "node", "gpu")[:limit]
    return [dict(sample_payload(s)) for s in rows]


def job_summary(*, job: Job) -> dict:
    """Mean utilisation and peak memory over the whole run (for the summary row)."""
    from django.db.models import Avg, Max

    figures = JobMetricSample.objects.filter(job=job).aggregate(
        mean_utilization=Avg("utilization"),
        peak_memory_mib=Max("memory_used_mib"),
        memory_total_mib=Max("memory_total_mib"),
    )
    return {k: (round(v, 1) if v is not None else None) for k, v in figures.items()}


CHARTS = (
    ("utilization", "GPU utilisation", "%"),
    ("memory_used_mib", "GPU memory used", "MiB"),
    ("power_w", "Power", "W"),
    ("temperature_c", "Temperature", "°C"),
)


def trace_key(node: str, gpu: int) -> str:
    return f"{node}/gpu{gpu}"


def job_figures(samples: list[dict]) -> dict[str, dict]:
    """One Plotly figure per chart (JSON for plotly.js): a line per GPU of every node,
    tagged with `meta` = "<node>/gpu<index>" so live samples extend the right trace."""
    import plotly.graph_objects as go

    by_gpu: dict[str, list[dict]] = defaultdict(list)
    for sample in samples:
        by_gpu[trace_key(sample["node"], sample["gpu"])].append(sample)
    figures = {}
    for field, title, unit in CHARTS:
        figure = go.Figure(
            layout={
                "title": {"text": title, "font": {"size": 14}},
                "height": 240,
                "margin": {"l": 50, "r": 10, "t": 36, "b": 30},
                "template": "none",  # the page's CSS gives the look; keeps the JSON small
                "yaxis": {"title": {"text": unit}, "rangemode": "tozero", "gridcolor": "#8884"},
                "xaxis": {"type": "date", "gridcolor": "#8884"},
                "legend": {"orientation": "h", "y": -0.25},
                "paper_bgcolor": "rgba(0,0,0,0)",
                "plot_bgcolor": "rgba(0,0,0,0)",
            }
        )
        if field == "utilization":
            figure.update_yaxes(range=[0, 100])
        for key, rows in sorted(by_gpu.items()):
            figure.add_scatter(
                x=[r["at"] for r in rows],
                y=[r[field] for r in rows],
                name=key.replace("/gpu", " GPU "),
                meta=key,
                mode="lines",
            )
        figures[field] = json.loads(figure.to_json())
    return figures
