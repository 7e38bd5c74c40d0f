"""GPU metrics of running jobs: collected every METRICS_INTERVAL seconds by a periodic
task, stored (raw for METRICS_RAW_RETENTION, then 1-minute means), published live.

Each job's backend reads its GPUs (`ComputeBackend.gpu_readings`: NVML on the local
host, the DCGM exporter through Prometheus on Kubernetes; jobs.gpu_readings), once per
tick for all its running jobs; this module stores, publishes, downsamples and charts.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta
from statistics import fmean

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.charts import (
    GPU_LINE_PALETTE,
    GPU_TYPE_PALETTE,
    NODE_DASHES,
    PER_GPU_LINES_MAX,
    fit_axes,
    translucent,
)
from jobs import alerts, realtime, repair
from jobs.backends import BackendUnavailable, get_backend
from jobs.backends.base import GpuReading
from jobs.models import Job, JobEvent, JobMetricSample, JobStatus, MetricResolution

log = logging.getLogger(__name__)

NOTE_NO_GPU = "no GPU"
SAMPLE_FIELDS = (
    "utilization",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
)


# --- collection -------------------------------------------------------------------------------


def metrics_note(job: Job) -> str:
    """Why a job has no GPU readings ("" when it should have some)."""
    if not job.gpus_per_node:
        return NOTE_NO_GPU
    return get_backend(job.backend).metrics_note(job)


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
    now = now or timezone.now()
    running = list(Job.objects.filter(status=JobStatus.RUNNING).select_related("tenant"))
    by_backend: dict[str, list[Job]] = defaultdict(list)
    for job in running:
        if job.gpus_per_node:
            by_backend[job.backend].append(job)
    by_job: dict[int, list[GpuReading]] = {}
    for backend_name, jobs in by_backend.items():
        try:
            by_job.update(get_backend(backend_name).gpu_readings(jobs))
        except BackendUnavailable as error:
            log.warning("reading GPU metrics of %s jobs failed: %s", backend_name, error)
    stored = 0
    for job in running:
        readings = by_job.get(job.pk)
        if readings:
            stored += len(metrics_record(job=job, readings=readings, at=now))
            try:
                _self_repair(job, readings, now)
            except Exception:
                log.exception("self-repair of job %s failed", job.pk)
        try:
            alerts.alerts_evaluate(job=job, now=now)
        except Exception:
            log.exception("evaluating the alert rules of job %s failed", job.pk)
    return stored


def _self_repair(job: Job, readings: list[GpuReading], now: datetime) -> None:
    """Hardware-looking faults in this tick's readings (jobs.repair): XID errors or
    double-bit ECC errors, or a rank of a multi-node job stuck while the others run."""
    faulty = [reading for reading in readings if reading.faulty]
    if faulty:
        repair.job_hardware_fault(job=job, faulty=faulty, now=now)
    elif job.nodes > 1:
        since = now - 2 * repair.STUCK_WINDOW
        samples = list(JobMetricSample.objects.filter(job=job, at__gte=since).order_by("at"))
        repair.job_stuck_rank(job=job, readings=readings, samples=samples, now=now)


def metrics_downsample(*, now: datetime | None = None, batch: int = 20000) -> int:
    """Replace raw samples older than the raw retention by their 1-minute means (per job,
    node and GPU). Safe to run twice: a minute already averaged is merged, not doubled."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.METRICS_RAW_RETENTION)
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
AGGREGATE_KEYS = ("agg/min", "agg/max", "agg/mean")


def trace_key(node: str, gpu: int) -> str:
    return f"{node}/gpu{gpu}"


def job_markers(*, job: Job, since: datetime | None = None) -> list[dict]:
    """The job's pauses, resumes and preemptions (realtime.CHART_MARKERS) since `since`,
    as the chart markers the page draws: `{"at", "label"}`."""
    events = JobEvent.objects.filter(job=job, to_status__in=list(realtime.CHART_MARKERS))
    if since is not None:
        events = events.filter(at__gte=since)
    return [
        {"at": at.isoformat(), "label": realtime.CHART_MARKERS[status]}
        for at, status in events.order_by("at", "id").values_list("at", "to_status")
    ]


def _marker_layout(markers: list[dict]) -> dict:
    return {
        "shapes": [
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": m["at"],
                "x1": m["at"],
                "y0": 0,
                "y1": 1,
                "line": {"color": "#555", "width": 1, "dash": "dot"},
            }
            for m in markers
        ],
        "annotations": [
            {
                "x": m["at"],
                "xref": "x",
                "y": 1,
                "yref": "paper",
                "yanchor": "bottom",
                "text": m["label"],
                "showarrow": False,
                "font": {"size": 10},
            }
            for m in markers
        ],
    }


def _per_gpu_traces(by_gpu: dict[str, list[dict]], field: str, visible: bool) -> list[dict]:
    nodes = sorted({key.split("/gpu")[0] for key in by_gpu})
    traces = []
    for key, rows in sorted(by_gpu.items()):
        node, gpu = key.split("/gpu")
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": [r["at"] for r in rows],
                "y": [r[field] for r in rows],
                "name": key.replace("/gpu", " GPU "),
                "meta": key,
                "visible": visible,
                "line": {
                    "color": GPU_LINE_PALETTE[int(gpu) % len(GPU_LINE_PALETTE)],
                    "dash": NODE_DASHES[nodes.index(node) % len(NODE_DASHES)],
                },
            }
        )
    return traces


def _aggregate_traces(samples: list[dict], field: str, colour: str, gpus: int) -> list[dict]:
    """Lowest and highest GPU per tick (a band) and their mean (a line): a reading of
    every GPU at once, where 16 lines would be a tangle. Readings of one tick share `at`."""
    by_tick: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        if sample[field] is not None:
            by_tick[sample["at"]].append(sample[field])
    ticks = sorted(by_tick)
    low = [min(by_tick[t]) for t in ticks]
    high = [max(by_tick[t]) for t in ticks]
    mean = [round(fmean(by_tick[t]), 2) for t in ticks]
    band = {"type": "scatter", "mode": "lines", "x": ticks, "line": {"width": 0, "color": colour}}
    return [
        {**band, "y": low, "name": "Lowest GPU", "meta": "agg/min", "showlegend": False},
        {
            **band,
            "y": high,
            "name": "Highest GPU",
            "meta": "agg/max",
            "fill": "tonexty",
            "fillcolor": translucent(colour, 0.25),
            "legendgroup": "band",
        },
        {
            "type": "scatter",
            "mode": "lines",
            "x": ticks,
            "y": mean,
            "name": f"Mean of {gpus} GPUs",
            "meta": "agg/mean",
            "line": {"color": colour, "width": 2},
        },
    ]


def job_figures(
    samples: list[dict], *, colour: str = GPU_TYPE_PALETTE[0], markers: list[dict] | None = None
) -> dict[str, dict]:
    """One Plotly figure (plain JSON) per chart. Up to PER_GPU_LINES_MAX GPUs: a line per
    GPU of every node, tagged with `meta` = "<node>/gpu<index>" so live samples extend the
    right trace. Above: the mean with a min–max band in the GPU type's colour
    (`layout.meta.aggregate`), the per-GPU lines present but hidden until asked for.
    `markers` (job_markers) become dotted vertical lines with their label."""
    by_gpu: dict[str, list[dict]] = defaultdict(list)
    for sample in samples:
        by_gpu[trace_key(sample["node"], sample["gpu"])].append(sample)
    aggregate = len(by_gpu) > PER_GPU_LINES_MAX
    figures = {}
    for field, title, unit in CHARTS:
        yaxis: dict = {"title": {"text": unit}, "rangemode": "tozero", "gridcolor": "#8884"}
        if field == "utilization":
            yaxis["range"] = [0, 100]
        layout = {
            "title": {"text": title, "font": {"size": 14}},
            "height": 240,
            "margin": {"l": 50, "r": 10, "t": 36, "b": 30},
            "yaxis": yaxis,
            "xaxis": {"type": "date", "gridcolor": "#8884"},
            "legend": {"orientation": "h", "y": -0.25},
            "paper_bgcolor": "rgba(0,0,0,0)",
            "plot_bgcolor": "rgba(0,0,0,0)",
            "meta": {"aggregate": aggregate, "gpus": len(by_gpu), "unit": unit},
            **_marker_layout(markers or []),
        }
        data = _per_gpu_traces(by_gpu, field, visible=not aggregate)
        if aggregate:
            data = _aggregate_traces(samples, field, colour, len(by_gpu)) + data
        figures[field] = {"data": data, "layout": fit_axes(layout)}
    return figures
