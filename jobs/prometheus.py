"""Jobs' metrics for /metrics. Scrape-time (registered with console.metrics from
`jobs.receivers.connect()`): jobs by status, and per pool the queue's depth and the wait
of its oldest queued job, two GROUP BY queries a scrape whatever the number of jobs.
Counted where things happen: dispatch latency (jobs.services.dispatch) and the watcher's
events and passes (`manage.py run_watcher`, which serves them on METRICS_WORKER_PORT)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from jobs.models import Job, JobEvent, JobStatus

DISPATCH_LATENCY = Histogram(
    "gpugeek_dispatch_latency_seconds",
    "From a job's admission (it became dispatching: at submit, unless it queued) to its "
    "backend accepting the attempt, by backend.",
    ["backend"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
)
WATCHER_EVENTS = Counter(
    "gpugeek_watcher_events",
    "Job changes the backends' watches reported to the watcher, by backend.",
    ["backend"],
)
WATCHER_LAST_EVENT = Gauge(
    "gpugeek_watcher_last_event_timestamp_seconds",
    "When each backend's watch last reported a change (Unix time).",
    ["backend"],
    multiprocess_mode="mostrecent",
)
WATCHER_PASS_DURATION = Histogram(
    "gpugeek_watcher_pass_duration_seconds",
    "Run time of a watcher pass: `full` observes every live job (the periodic resync), "
    "`changed` only the jobs the watches reported.",
    ["kind"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
WATCHER_LAST_PASS = Gauge(
    "gpugeek_watcher_last_pass_timestamp_seconds",
    "When the watcher last finished a pass of each kind (Unix time).",
    ["kind"],
    multiprocess_mode="mostrecent",
)
WATCHER_BACKEND_UNAVAILABLE = Counter(
    "gpugeek_watcher_backend_unavailable",
    "Watcher passes over a backend that could not be reached, by backend.",
    ["backend"],
)


def dispatch_latency_observe(
    *, job: Job, backend_name: str, admitted_at: datetime | None = None
) -> None:
    """Count the dispatch that has just moved `job` out of dispatching. `admitted_at` is
    when it became dispatching, if the caller knows; else (a retry note touched
    status_changed_at since) it is read from the timeline, which retries never touch."""
    if admitted_at is None:
        admitted_at = (
            JobEvent.objects.filter(job=job, to_status=JobStatus.DISPATCHING)
            .order_by("-at", "-id")
            .values_list("at", flat=True)
            .first()
        )
    if admitted_at is None:  # a row put in dispatching around jobs.state: nothing to time
        return
    latency = (job.status_changed_at - admitted_at).total_seconds()
    DISPATCH_LATENCY.labels(backend_name).observe(max(0.0, latency))


class JobsCollector:
    def collect(self) -> Iterator[Metric]:
        by_status = dict(Job.objects.order_by().values_list("status").annotate(n=Count("id")))
        jobs = GaugeMetricFamily("gpugeek_jobs", "Jobs by status.", labels=["status"])
        for status in JobStatus.values:
            jobs.add_metric([status], by_status.get(status, 0))
        yield jobs

        now = timezone.now()
        depth = GaugeMetricFamily(
            "gpugeek_queue_depth", "Queued jobs, by the pool they wait for.", labels=["pool"]
        )
        oldest = GaugeMetricFamily(
            "gpugeek_queue_oldest_wait_seconds",
            "How long the oldest queued job of each pool has waited.",
            labels=["pool"],
        )
        rows = (
            Job.objects.filter(status=JobStatus.QUEUED)
            .order_by()
            .values_list("pool__slug")
            .annotate(n=Count("id"), since=Min("status_changed_at"))
        )
        for pool, count, since in rows:
            depth.add_metric([pool or ""], count)
            oldest.add_metric([pool or ""], max(0.0, (now - since).total_seconds()))
        yield depth
        yield oldest
