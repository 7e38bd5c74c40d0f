"""Jobs' scrape-time metrics for /metrics (registered with console.metrics from
`jobs.receivers.connect()`): jobs by status, and per pool the queue's depth and the wait
of its oldest queued job. Two GROUP BY queries a scrape, whatever the number of jobs."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from jobs.models import Job, JobStatus


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
