"""Billing's metrics for /metrics. Scrape-time (registered with console.metrics from
`billing.receivers.connect()`): how far metering lags behind now. Counted where budgets
enforce: how long a used-up budget's jobs ran on before their pause was asked. The tick's
own run time is console's `gpugeek_celery_task_last_duration_seconds` of its task,
counted for every task."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from billing.models import JobMeter

# Measured from the instant the enforcing tick metered usage up to, so it includes the
# tick's own run time; the spend crossed the budget at most one metering interval earlier.
BUDGET_ENFORCEMENT_LAG = Histogram(
    "gpugeek_budget_enforcement_lag_seconds",
    "From the metering tick that found a budget used up (the instant it metered up to) to "
    "the pause of each of the budget's running non-critical jobs being requested.",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)


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
