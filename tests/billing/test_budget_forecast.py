"""The month-end forecast (issue 32 item 10): spend so far plus each running job until its
maximum runtime or the month's end; a forecast alert only once the forecast has held over
its threshold for BUDGET_FORECAST_HOLD_MINUTES; a forecast alert cleared when the forecast
falls back (its jobs ended), and able to fire again later."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from billing.budgets.services import budget_create, meter_and_enforce
from billing.models import BudgetAlert
from billing.selectors import forecast_month_end, period_end, period_start
from console.models import Notification
from jobs.models import Job, JobStatus
from marketplace.models import PriceVersion
from tests.billing.conftest import set_status
from tests.conftest import signed_in_client, token_client
from tests.jobs_helpers import at_time, submit

CPU_PRICE = Decimal("0.0125")  # demo price per vCPU-hour in region "local"


@pytest.fixture
def start(catalog):
    """10:00 on the 2nd of a month fully inside the price book."""
    first = PriceVersion.objects.order_by("effective_from").first()
    return period_start(first.effective_from + timedelta(days=40)) + timedelta(days=1, hours=10)


def running(world, start, *, name="train", max_runtime_minutes=24 * 60, cpus=1) -> Job:
    with at_time(start - timedelta(seconds=5)):
        job = submit(world, name, cpus=cpus, max_runtime_minutes=max_runtime_minutes)
    return set_status(job, JobStatus.RUNNING, start)


def forecast_budget(world, amount: str, thresholds=(50,)):
    return budget_create(
        tenant=world.tenant,
        user=world.owner,
        name="Forecast cap",
        amount=Decimal(amount),
        thresholds=list(thresholds),
        action="alert_only",
    )


def test_a_running_job_is_forecast_to_its_max_runtime_not_the_whole_month(world, start):
    job = running(world, start, max_runtime_minutes=120)
    jobs = Job.objects.for_tenant(world.tenant)
    at = start + timedelta(minutes=30)
    # 90 minutes of runtime left at 1 vCPU × 0.0125 per hour.
    assert forecast_month_end(jobs=jobs, spend=Decimal(1), now=at) == Decimal(
        1
    ) + CPU_PRICE * Decimal("1.5")
    # Past its max runtime (the watcher will end it): nothing more is forecast.
    assert forecast_month_end(jobs=jobs, spend=Decimal(1), now=start + timedelta(hours=3)) == 1
    # A job that may run longer than the month is forecast to the month's end only.
    long = running(world, start, name="long", max_runtime_minutes=60 * 24 * 90)
    month_left = Decimal(str((period_end(at) - at).total_seconds())) / 3600
    assert (
        forecast_month_end(jobs=jobs.filter(pk=long.pk), spend=Decimal(0), now=at)
        == CPU_PRICE * month_left
    )
    # Only running jobs count.
    set_status(job, JobStatus.CANCELLED, at)
    assert forecast_month_end(jobs=jobs.exclude(pk=long.pk), spend=Decimal(2), now=at) == 2


def test_one_short_launch_does_not_fire_a_forecast_alert(world, start):
    # A budget of 20 vCPU-hours: a run rate × the rest of the month (~650 h) would cross
    # 50 % at once; a 2-hour job is 10 % of it.
    budget = forecast_budget(world, str(CPU_PRICE * 20), thresholds=(25, 50))
    running(world, start, max_runtime_minutes=120)
    for minutes in range(0, 180, 15):
        meter_and_enforce(now=start + timedelta(minutes=minutes))
    assert not BudgetAlert.objects.filter(budget=budget).exists()


def test_a_forecast_alert_fires_only_after_the_forecast_held(world, start, settings):
    settings.BUDGET_FORECAST_HOLD_MINUTES = 60
    # 24 hours of one vCPU is 0.3; the budget is 0.5: forecast 60 %, spend far below 50 %.
    budget = forecast_budget(world, "0.5", thresholds=(50,))
    running(world, start)
    for minutes in (1, 30, 59):
        meter_and_enforce(now=start + timedelta(minutes=minutes))
        assert not BudgetAlert.objects.filter(budget=budget).exists(), minutes
    meter_and_enforce(now=start + timedelta(minutes=61))
    alert = BudgetAlert.objects.get(budget=budget)
    assert (alert.threshold, alert.kind, alert.cleared_at) == (50, "forecast", None)
    assert (
        Notification.objects.filter(
            user=world.owner, title="Budget “Forecast cap” forecast to reach 50 %"
        ).count()
        == 1
    )


def test_a_forecast_alert_clears_when_its_jobs_end_and_may_fire_again(world, start, settings):
    settings.BUDGET_FORECAST_HOLD_MINUTES = 30
    budget = forecast_budget(world, "0.5", thresholds=(50,))
    job = running(world, start)
    meter_and_enforce(now=start + timedelta(minutes=1))
    meter_and_enforce(now=start + timedelta(minutes=31))
    assert BudgetAlert.objects.get(budget=budget).cleared_at is None

    cancelled_at = start + timedelta(minutes=40)
    set_status(job, JobStatus.CANCELLED, cancelled_at)
    meter_and_enforce(now=cancelled_at + timedelta(minutes=1))
    alert = BudgetAlert.objects.get(budget=budget)
    assert alert.cleared_at == cancelled_at + timedelta(minutes=1)
    budget.refresh_from_db()
    assert budget.forecast_over_since == {}

    # The budgets page says the alert was cleared, not that the budget is forecast over.
    page = signed_in_client(world.owner, world.tenant).get("/billing/budgets/")
    assert "cleared" in page.content.decode()

    # A new long job: after the hold the same alert fires again, once, with a new notice.
    later = start + timedelta(hours=2)
    running(world, later, name="again")
    meter_and_enforce(now=later + timedelta(minutes=1))
    assert BudgetAlert.objects.get(budget=budget).cleared_at is not None  # not held yet
    meter_and_enforce(now=later + timedelta(minutes=31))
    meter_and_enforce(now=later + timedelta(minutes=35))
    again = BudgetAlert.objects.get(budget=budget)
    assert again.cleared_at is None and again.created_at == later + timedelta(minutes=31)
    titles = Notification.objects.filter(user=world.owner, title__contains="forecast to reach")
    assert titles.count() == 2


def test_cost_summary_forecast_uses_the_same_rule(world, catalog):
    job = submit(world, "train", cpus=2, max_runtime_minutes=60)
    set_status(job, JobStatus.RUNNING, job.created_at)
    body = token_client(world.member, world.tenant).get("/api/v1/costs/summary").json()
    forecast = Decimal(body["forecast"])
    # At most one hour of 2 vCPUs beyond what was spent, not a month of them.
    assert (
        Decimal(body["month_to_date"]) <= forecast <= Decimal(body["month_to_date"]) + 2 * CPU_PRICE
    )
