"""The billing API contract: /api/v1/budgets (CRUD, roles, tenant scope),
/api/v1/usage (rows, group-by, inclusive end, bad dates) and /api/v1/costs/summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from billing import selectors
from billing.job_costs import job_run_rate
from billing.metering import meter_tick
from billing.models import Budget, UsageRecord
from billing.selectors import CostQuery, period_start, run_rate
from jobs.models import Job, JobStatus
from tests.billing.conftest import make_job, set_status
from tests.conftest import token_client

BUDGETS = "/api/v1/budgets"
USAGE = "/api/v1/usage"
SUMMARY = "/api/v1/costs/summary"
ROW_KEYS = {"key", "gpu_seconds", "cpu_seconds", "amount", "currency"}
BUDGET = {
    "name": "Vision team",
    "amount": "1500.123456",
    "period": "monthly",
    "thresholds": [50, 80, 100],
    "action": "pause_non_critical",
    "project": "vision",
}


@pytest.fixture
def apis(world, catalog):
    return {role: token_client(getattr(world, role), world.tenant) for role in ROLES}


ROLES = ("owner", "admin", "finance", "member", "viewer")


# --- budgets ----


def test_create_read_patch_delete(apis):
    owner = apis["owner"]
    response = owner.post(BUDGETS, BUDGET, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    budget_id = created["id"]
    assert isinstance(budget_id, int)
    assert {k: created[k] for k in BUDGET} == BUDGET
    assert created["currency"] == "USD"
    assert Budget.objects.get(pk=budget_id).amount == Decimal("1500.123456")

    listed = owner.get(BUDGETS).json()
    assert listed["count"] == 1 and [b["id"] for b in listed["results"]] == [budget_id]
    assert owner.get(f"{BUDGETS}/{budget_id}").json() == created

    response = owner.patch(f"{BUDGETS}/{budget_id}", {"amount": "2000"}, format="json")
    assert response.status_code == 200, response.content
    patched = response.json()
    assert patched["amount"] == "2000.000000"
    assert {k: patched[k] for k in ("name", "thresholds", "action", "project")} == {
        k: BUDGET[k] for k in ("name", "thresholds", "action", "project")
    }
    response = owner.patch(
        f"{BUDGETS}/{budget_id}", {"thresholds": [90, 75], "action": "alert_only"}, format="json"
    )
    assert response.status_code == 200
    assert (response.json()["thresholds"], response.json()["action"]) == ([75, 90], "alert_only")
    assert response.json()["amount"] == "2000.000000"

    assert owner.delete(f"{BUDGETS}/{budget_id}").status_code == 204
    assert owner.get(f"{BUDGETS}/{budget_id}").status_code == 404
    assert not Budget.objects.exists()


def test_defaults(apis):
    response = apis["owner"].post(BUDGETS, {"name": "All", "amount": "10"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["thresholds"], body["action"], body["project"], body["period"]) == (
        [50, 80, 100],
        "pause_non_critical",
        "",
        "monthly",
    )


@pytest.mark.parametrize("role", ["admin", "finance"])
def test_admins_and_finance_may_write(apis, role):
    api = apis[role]
    response = api.post(BUDGETS, BUDGET, format="json")
    assert response.status_code == 201, response.content
    budget_id = response.json()["id"]
    assert api.patch(f"{BUDGETS}/{budget_id}", {"amount": "1"}, format="json").status_code == 200
    assert api.delete(f"{BUDGETS}/{budget_id}").status_code == 204


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_members_read_but_may_not_write(apis, world, role):
    budget_id = apis["owner"].post(BUDGETS, BUDGET, format="json").json()["id"]
    api = apis[role]
    assert api.get(BUDGETS).status_code == 200
    assert api.get(BUDGETS).json()["count"] == 1
    assert api.get(f"{BUDGETS}/{budget_id}").status_code == 200
    assert api.post(BUDGETS, {**BUDGET, "name": "Mine"}, format="json").status_code == 403
    patch = api.patch(f"{BUDGETS}/{budget_id}", {"amount": "1"}, format="json")
    assert patch.status_code == 403
    assert "detail" in patch.json()
    assert api.put(f"{BUDGETS}/{budget_id}", BUDGET, format="json").status_code == 403
    assert api.delete(f"{BUDGETS}/{budget_id}").status_code == 403
    assert Budget.objects.get(pk=budget_id).amount == Decimal("1500.123456")
    assert Budget.objects.count() == 1


def test_another_tenants_budget_is_a_404(apis, other_world):
    budget_id = apis["owner"].post(BUDGETS, BUDGET, format="json").json()["id"]
    theirs = token_client(other_world.owner, other_world.tenant)
    assert theirs.get(BUDGETS).json()["count"] == 0
    assert theirs.get(f"{BUDGETS}/{budget_id}").status_code == 404
    assert theirs.patch(f"{BUDGETS}/{budget_id}", {"amount": "1"}, format="json").status_code == 404
    assert theirs.delete(f"{BUDGETS}/{budget_id}").status_code == 404
    assert Budget.objects.get(pk=budget_id).amount == Decimal("1500.123456")


def test_anonymous_is_refused(db):
    assert APIClient().get(BUDGETS).status_code in (401, 403)
    assert APIClient().get(USAGE).status_code in (401, 403)


@pytest.mark.parametrize(
    ("changes", "field", "status"),
    [
        ({"amount": "0"}, "amount", 400),
        ({"amount": "-10"}, "amount", 400),
        ({"amount": "12.1234567"}, "amount", 400),
        ({"amount": "twelve"}, "amount", 400),
        ({"thresholds": [0, 80]}, "thresholds", 400),
        ({"thresholds": [50, 250]}, "thresholds", 400),
        ({"thresholds": [50.5]}, "thresholds", 400),
        ({"thresholds": "50,80"}, "thresholds", 400),
        ({"thresholds": []}, "thresholds", 400),
        ({"action": "shutdown"}, "action", 400),
        ({"period": "weekly"}, "period", 400),
        ({"name": ""}, "name", 400),
    ],
)
def test_bad_budget_input_is_a_400_naming_the_field(apis, changes, field, status):
    response = apis["owner"].post(BUDGETS, {**BUDGET, **changes}, format="json")
    assert response.status_code == status, response.content
    assert field in response.json(), response.json()
    assert not Budget.objects.exists()


def test_bad_patch_leaves_the_budget_alone(apis):
    budget_id = apis["owner"].post(BUDGETS, BUDGET, format="json").json()["id"]
    response = apis["owner"].patch(f"{BUDGETS}/{budget_id}", {"amount": "0"}, format="json")
    assert response.status_code == 400 and "amount" in response.json()
    response = apis["owner"].patch(f"{BUDGETS}/{budget_id}", {"thresholds": [300]}, format="json")
    assert response.status_code == 400 and "thresholds" in response.json()
    assert Budget.objects.get(pk=budget_id).amount == Decimal("1500.123456")


def test_a_duplicate_name_is_a_conflict(apis):
    assert apis["owner"].post(BUDGETS, BUDGET, format="json").status_code == 201
    response = apis["owner"].post(BUDGETS, {**BUDGET, "amount": "5"}, format="json")
    assert response.status_code == 409
    assert "name" in response.json() and "exists" in response.json()["detail"]


# --- usage ----


@pytest.fixture
def usage(world, other_world, catalog):
    """A 1-vCPU job metered across two days of a past month, and another tenant's job."""
    day = period_start(timezone.now()) - timedelta(days=20)  # inside last month
    start = datetime(day.year, day.month, day.day, 22, tzinfo=UTC)
    ours = make_job(world, name="etl", project="data", start=start)
    theirs = make_job(other_world, name="secret-etl", start=start)
    set_status(ours, JobStatus.RUNNING, start)
    set_status(theirs, JobStatus.RUNNING, start)
    for hours in (1, 3, 5):
        meter_tick(now=start + timedelta(hours=hours))
    return {"first": start.date(), "second": start.date() + timedelta(days=1)}


def get_usage(api, **params):
    response = api.get(USAGE, params)
    assert response.status_code == 200, response.content
    return response.json()


@pytest.mark.parametrize("group_by", ["gpu_type", "job", "tier", "region", "day"])
def test_usage_rows(apis, world, usage, group_by):
    first, second = usage["first"], usage["second"]
    body = get_usage(apis["viewer"], start=first, end=second, group_by=group_by)
    assert set(body) == {"count", "next", "previous", "results"}
    assert body["count"] == len(body["results"])
    for row in body["results"]:
        assert set(row) == ROW_KEYS
        assert isinstance(row["amount"], str) and Decimal(row["amount"]) > 0
        assert row["currency"] == "USD"
    query = CostQuery(
        start=datetime.combine(first, datetime.min.time(), tzinfo=UTC),
        end=datetime.combine(second + timedelta(days=1), datetime.min.time(), tzinfo=UTC),
        group_by=group_by,
    )
    expected = selectors.usage_rows(tenant=world.tenant, query=query)
    assert [
        (r["key"], Decimal(r["amount"]), Decimal(r["cpu_seconds"])) for r in body["results"]
    ] == [(r["key"], r["amount"], r["cpu_seconds"]) for r in expected]
    keys = [r["key"] for r in body["results"]]
    assert (
        keys
        == {
            "gpu_type": ["cpu"],
            "job": ["etl"],
            "tier": ["on_demand"],
            "region": ["local"],
            "day": [first.isoformat(), second.isoformat()],
        }[group_by]
    )


def test_usage_end_is_inclusive_and_sums_to_the_ledger(apis, world, usage):
    first, second = usage["first"], usage["second"]
    only_first = get_usage(apis["member"], start=first, end=first, group_by="day")["results"]
    assert [r["key"] for r in only_first] == [first.isoformat()]
    assert Decimal(only_first[0]["cpu_seconds"]) == Decimal("7200.000")  # 22:00 to midnight
    both = get_usage(apis["member"], start=first, end=second, group_by="job")["results"]
    ledger = UsageRecord.objects.filter(tenant=world.tenant)
    assert Decimal(both[0]["amount"]) == sum(r.amount for r in ledger)
    assert Decimal(both[0]["cpu_seconds"]) == Decimal(5 * 3600)
    assert get_usage(apis["member"], start=second + timedelta(days=1))["count"] == 0


def test_usage_defaults_to_this_month(apis, usage):
    body = get_usage(apis["member"])
    assert body["count"] == 0  # the usage was last month


def test_usage_filters(apis, usage):
    first, second = usage["first"], usage["second"]
    common = {"start": first, "end": second, "group_by": "job"}
    assert get_usage(apis["member"], **common, tier="spot")["count"] == 0
    assert get_usage(apis["member"], **common, region="local")["count"] == 1
    assert get_usage(apis["member"], **common, job="ET")["count"] == 1
    assert get_usage(apis["member"], **common, job="secret")["count"] == 0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "yesterday"}, "start"),
        ({"start": "2026-01-01", "end": "01/02/2026"}, "end"),
        ({"start": "2026-03-10", "end": "2026-03-01"}, "end"),
        ({"start": "2023-01-01", "end": "2026-03-01"}, "end"),
        # The end of the calendar: the day after it can't be computed (was a 500).
        ({"start": "9999-12-31", "end": "9999-12-31"}, "start"),
        ({"start": "2026-03-01", "end": "9999-12-31"}, "end"),
        ({"end": "9999-12-31"}, "end"),
    ],
)
def test_bad_usage_dates_are_a_400(apis, params, field):
    response = apis["member"].get(USAGE, params)
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert response.json()["detail"]
    assert response.json()["code"] == "invalid"


@pytest.mark.parametrize("group_by", list(selectors.GROUP_BY))
def test_usage_accepts_the_last_day_a_range_may_hold(apis, group_by):
    last = selectors.LAST_DAY.isoformat()
    assert get_usage(apis["member"], start=last, end=last, group_by=group_by)["count"] == 0


def test_unknown_group_by_is_a_400(apis):
    response = apis["member"].get(USAGE, {"group_by": "colour"})
    assert response.status_code == 400
    assert "group_by" in response.json()


# --- cost summary ----


def test_cost_summary(apis, world, catalog):
    now = timezone.now()
    since = max(now - timedelta(minutes=10), period_start(now))
    job = make_job(world, name="train", start=since)
    set_status(job, JobStatus.RUNNING, since)
    meter_tick(now=now)
    apis["owner"].post(BUDGETS, {"name": "All", "amount": "1000"}, format="json")
    body = apis["viewer"].get(SUMMARY).json()
    assert set(body) == {
        "period_start",
        "month_to_date",
        "run_rate_per_hour",
        "forecast",
        "currency",
        "budgets",
    }
    assert datetime.fromisoformat(body["period_start"]) == period_start(now)
    spent = sum(r.amount for r in UsageRecord.objects.filter(tenant=world.tenant))
    assert Decimal(body["month_to_date"]) == spent > 0
    assert Decimal(body["run_rate_per_hour"]) == Decimal("0.0125")  # one local vCPU
    assert Decimal(body["forecast"]) >= spent
    assert body["currency"] == "USD"
    [budget] = body["budgets"]
    assert set(budget) == {
        "id",
        "name",
        "amount",
        "spend",
        "percent",
        "forecast",
        "status",
        "project",
        "action",
    }
    assert (budget["name"], budget["status"], Decimal(budget["spend"])) == ("All", "ok", spent)


def test_run_rate_prices_each_configuration_once(world, catalog, django_assert_max_num_queries):
    """The forecast's run rate sums every running job's rate, in the same few queries
    however many jobs share a configuration."""

    def running(n: int, cpus: int) -> None:
        for i in range(n):
            set_status(
                make_job(world, name=f"{cpus}-{i}", cpus=cpus), JobStatus.RUNNING, timezone.now()
            )

    running(2, cpus=1)
    running(1, cpus=2)
    jobs = Job.objects.for_tenant(world.tenant)
    with django_assert_max_num_queries(20) as few:
        rate = run_rate(jobs)
    assert rate == sum(job_run_rate(job) for job in jobs) == Decimal("0.0125") * 4
    running(5, cpus=1)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert run_rate(jobs) == Decimal("0.0125") * 9


# --- a job's cost in the jobs API ----


def test_jobs_api_cost_of_a_finished_job_is_its_ledger(world, apis):
    """The list reads each row's ledger total with the row; the detail reads it apart:
    both answer the ledger's sum (to the micro-dollar)."""
    start = datetime(2026, 11, 2, 10, 0, 0, tzinfo=UTC)
    jobs = []
    for number, seconds in enumerate((125, 3700)):
        job = make_job(world, name=f"ran {number}", cpus=2, start=start)
        set_status(job, JobStatus.RUNNING, start)
        set_status(job, JobStatus.SUCCEEDED, start + timedelta(seconds=seconds))
        jobs.append(job)
    meter_tick(now=start + timedelta(hours=2))
    listed = {row["id"]: row for row in apis["member"].get("/api/v1/jobs").json()["results"]}
    for job in jobs:
        ledger = sum(r.amount for r in UsageRecord.objects.filter(job=job))
        assert ledger > 0
        detail = apis["member"].get(f"/api/v1/jobs/{job.pk}").json()
        expected = ledger.quantize(Decimal("0.000001"))
        assert Decimal(listed[job.pk]["cost_to_date"]) == expected
        assert Decimal(detail["cost_to_date"]) == expected
