"""Billing's scrape-time metrics for /metrics (registered with console.metrics from
`billing.receivers.connect()`): how far metering lags behind now. The tick's own run
time is `gpugeek_celery_task_last_duration_seconds{task="billing.tasks.meter_tick_task"}`,
counted by console for every task."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from billing.models import JobMeter


class MeteringCollector:
    def collect(self) -> Iterator[Metric]:
        row = JobMeter.objects.filter(open=True).aggregate(
            oldest=Min("metered_until"), meters=Count("id")
        )
        lag = 0.0
        if row["oldest"] is not None:
            lag = max(0.0, (timezone.now() - row["oldest"]).total_seconds())
        yield GaugeMetricFamily(
            "gpugeek_metering_lag_seconds",
            "Now minus the oldest open meter's metered_until (0 when no meter is open).",
            value=lag,
        )
        yield GaugeMetricFamily(
            "gpugeek_open_meters", "Jobs being metered (open meters).", value=row["meters"]
        )
