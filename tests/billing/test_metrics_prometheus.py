"""Issue 17, "budget enforcement lag" on /metrics: from the metering tick that finds a
budget used up (the instant it metered up to) to each of its jobs' pause being asked."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from billing.budgets.services import budget_create, meter_and_enforce
from billing.selectors import period_start
from jobs.models import JobStatus
from tests.billing.conftest import make_job, set_status
from tests.console.test_prometheus_metrics import TOKEN, scrape, value

LAG = "gpugeek_budget_enforcement_lag_seconds"


def test_the_lag_runs_from_the_tick_to_each_pause(world, catalog, settings):
    settings.METRICS_TOKEN = TOKEN
    # A tick that metered up to 20 s ago, as if it had taken that long to run.
    tick_at = timezone.now() - timedelta(seconds=20)
    since = max(tick_at - timedelta(minutes=10), period_start(tick_at))
    jobs = [
        set_status(
            make_job(world, name=name, priority=priority, start=since), JobStatus.RUNNING, since
        )
        for name, priority in (("train", "normal"), ("eval", "normal"), ("serve", "critical"))
    ]
    budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount="0.000001")
    before = scrape()

    meter_and_enforce(now=tick_at)
    meter_and_enforce()  # a later tick pauses nothing more

    after = scrape()
    for job in jobs:
        job.refresh_from_db()
    assert [job.status for job in jobs] == [JobStatus.PAUSING, JobStatus.PAUSING, JobStatus.RUNNING]
    assert value(after, f"{LAG}_count") - value(before, f"{LAG}_count") == 2
    assert 40 <= value(after, f"{LAG}_sum") - value(before, f"{LAG}_sum") < 80
    for le, paused in (("10.0", 0), ("30.0", 2)):
        assert (
            value(after, f"{LAG}_bucket", le=le) - value(before, f"{LAG}_bucket", le=le) == paused
        )
