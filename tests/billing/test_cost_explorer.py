"""Cost Explorer: its numbers equal a direct SQL sum over the ledger for the same filters,
its CSV equals its table, it renders for every group-by (whole page, or only the
`explorer` partial for htmx), and bad filters get clear errors.

The usage is real: five jobs of four GPU types and CPU, on-demand and spot, in three
regions, run for three days (with a pause and a preemption) and metered by `meter_tick`
every three hours, plus another tenant's job that must never show.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from html import unescape

import pytest
from django.db import connection
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from billing import selectors
from billing.metering import meter_tick
from billing.models import AMOUNT_QUANTUM, JobMeter, MonthlyRollupMark, UsageRollup
from billing.selectors import CostQuery, period_start
from console.charts import has_points
from console.service_errors import ServiceError
from jobs.models import JobStatus
from jobs.services import JobSpec, job_submit
from marketplace.models import GpuType, PriceVersion, Tier
from tests.billing.conftest import make_job, set_status
from tests.conftest import signed_in_client
from tests.jobs_helpers import at_time

HOUR = Decimal(3600)
GROUPS = ["gpu_type", "job", "tier", "region", "day", "project"]
FILTERS = [
    {},
    {"gpu_type": "a100-80gb"},
    {"region": "us-west"},
    {"tier": "spot"},
    {"job_contains": "LLAMA"},
    {"gpu_type": "cpu"},
    {"region": "us-west", "tier": "on_demand", "job_contains": "e"},
]
# name: (gpu type, GPUs per node, nodes, spot ratio, region, project)
JOBS = {
    "bert-large": ("h100-80gb", 8, 1, "0", "us-west", "nlp"),
    "llama-finetune": ("a100-80gb", 4, 2, "0.5", "us-west", "nlp"),
    "sdxl-render": ("l40s", 2, 1, "1", "us-west", "vision"),
    "etl-nightly": (None, 0, 1, "0", "us-east", "data"),
    "resnet-sweep": ("a100-80gb", 2, 1, "1", "eu-central", "vision"),
}


def submit(world, name, gpu_type, gpus, nodes, spot_ratio, region, project):
    image = "pytorch-2-5-cuda12-4" if gpu_type else "python-3.11"
    with override_settings(COMPUTE_BACKENDS=["kubernetes"]):
        return job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=JobSpec(
                name=name,
                image=image,
                command=["python", "run.py"],
                nodes=nodes,
                gpus_per_node=gpus,
                gpu_type=gpu_type,
                cpus=None if gpu_type else 4,
                region=region,
                spot_ratio=Decimal(spot_ratio),
                project=project,
            ),
        )


def seed_usage(world, other_world, start: datetime) -> dict[str, int]:
    """Write the jobs' timelines and meter them every three hours, in time order."""
    with at_time(start - timedelta(seconds=5)):  # submitted just before the timelines
        jobs = {name: submit(world, name, *spec) for name, spec in JOBS.items()}
        jobs["intruder"] = submit(
            other_world, "llama-intruder", "a100-80gb", 4, 1, "0", "us-west", ""
        )

    def h(hours: float) -> datetime:
        return start + timedelta(hours=hours)

    timeline = [
        (h(0), "bert-large", JobStatus.RUNNING, None),
        (h(0.25), "intruder", JobStatus.RUNNING, None),
        (h(6), "llama-finetune", JobStatus.RUNNING, None),
        (h(16), "etl-nightly", JobStatus.RUNNING, None),
        (h(18), "llama-finetune", JobStatus.PAUSING, None),
        (h(18.01), "llama-finetune", JobStatus.PAUSED, None),
        (h(20.5), "etl-nightly", JobStatus.SUCCEEDED, None),
        (h(21.5), "sdxl-render", JobStatus.RUNNING, None),
        (h(24), "llama-finetune", JobStatus.RESUMING, None),
        (h(24.1), "llama-finetune", JobStatus.RUNNING, None),
        (h(36), "bert-large", JobStatus.SUCCEEDED, None),
        (h(38), "sdxl-render", JobStatus.PREEMPTED, None),
        (h(38), "sdxl-render", JobStatus.QUEUED, 2),
        (h(39), "sdxl-render", JobStatus.RUNNING, None),
        (h(42), "resnet-sweep", JobStatus.RUNNING, None),
        (h(54), "llama-finetune", JobStatus.SUCCEEDED, None),
        (h(62), "sdxl-render", JobStatus.FAILED, None),
        (h(65), "resnet-sweep", JobStatus.SUCCEEDED, None),
        (h(70), "intruder", JobStatus.SUCCEEDED, None),
    ]
    ticks = [h(3 * n + 0.1) for n in range(25)]
    for at, name, status, attempt in sorted(timeline, key=lambda e: e[0]):
        while ticks and ticks[0] < at:
            meter_tick(now=ticks.pop(0))
        set_status(jobs[name], status, at, attempt=attempt)
    for at in ticks:
        meter_tick(now=at)
    return {name: job.pk for name, job in jobs.items()}


@pytest.fixture
def usage(world, other_world, catalog):
    first = PriceVersion.objects.order_by("effective_from").first()
    # Three days in a month that lies wholly inside the price book.
    start = period_start(first.effective_from + timedelta(days=40)) + timedelta(days=2, hours=6)
    job_ids = seed_usage(world, other_world, start)
    first_day = start.date()
    return {
        "jobs": job_ids,
        "first_day": first_day,
        "last_day": first_day + timedelta(days=3),
        "query": selectors.CostQuery(
            start=datetime.combine(first_day, datetime.min.time(), tzinfo=UTC),
            end=datetime.combine(first_day + timedelta(days=4), datetime.min.time(), tzinfo=UTC),
        ),
    }


# --- the ledger, summed directly ----

KEY_SQL = {
    "gpu_type": "COALESCE(g.slug, 'cpu')",
    "job": "r.job_name",
    "tier": "r.tier",
    "region": "rg.slug",
    "project": "r.project",
}


def day_sql() -> str:
    if connection.vendor == "postgresql":
        return "to_char(r.interval_start AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
    return "substr(r.interval_start, 1, 10)"


def money(value) -> Decimal:
    """SQLite sums DECIMAL columns as floats; the ledger's quantum makes them exact again."""
    return Decimal(str(value)).quantize(AMOUNT_QUANTUM)


def ledger_sums(tenant, query: CostQuery, keys: list[str]) -> dict[tuple, dict[str, Decimal]]:
    """Σ over UsageRecord, grouped by `keys`, for the query's range and filters."""
    exprs = [day_sql() if key == "day" else KEY_SQL.get(key, key) for key in keys]
    where = ["r.tenant_id = %s", "r.interval_start >= %s", "r.interval_start < %s"]
    params: list = [
        tenant.pk,
        connection.ops.adapt_datetimefield_value(query.start),
        connection.ops.adapt_datetimefield_value(query.end),
    ]
    for column, value in (
        ("COALESCE(g.slug, 'cpu')", query.gpu_type),
        ("rg.slug", query.region),
        ("r.tier", query.tier),
    ):
        if value:
            where.append(f"{column} = %s")
            params.append(value)
    if query.job_contains:
        where.append("LOWER(r.job_name) LIKE %s")
        params.append(f"%{query.job_contains.lower()}%")
    sql = (
        f"SELECT {', '.join(exprs)}, SUM(r.gpu_seconds), SUM(r.cpu_seconds), SUM(r.amount), "
        "SUM(r.on_demand_amount) FROM billing_usagerecord r "
        "LEFT JOIN marketplace_gputype g ON g.id = r.gpu_type_id "
        "JOIN marketplace_region rg ON rg.id = r.region_id "
        f"WHERE {' AND '.join(where)} GROUP BY {', '.join(exprs)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    n = len(keys)
    return {
        tuple(str(v) for v in row[:n]): {
            "gpu_seconds": Decimal(str(row[n])).quantize(Decimal("0.001")),
            "cpu_seconds": Decimal(str(row[n + 1])).quantize(Decimal("0.001")),
            "amount": money(row[n + 2]),
            "on_demand_amount": money(row[n + 3]),
        }
        for row in rows
    }


def test_the_usage_is_varied(usage, world):
    totals = ledger_sums(world.tenant, usage["query"], ["gpu_type", "tier", "region"])
    assert {k[0] for k in totals} == {"h100-80gb", "a100-80gb", "l40s", "cpu"}
    assert {k[1] for k in totals} == {"on_demand", "spot"}
    assert {k[2] for k in totals} == {"us-west", "us-east", "eu-central"}
    assert all(v["amount"] > 0 for v in totals.values())


def test_chart_and_table_data_equal_a_direct_sql_sum(usage, world):
    for filters in FILTERS:
        check_against_the_ledger(world, usage, filters)


def check_against_the_ledger(world, usage, filters: dict) -> None:
    base = usage["query"]
    for group_by in GROUPS:
        query = CostQuery(start=base.start, end=base.end, group_by=group_by, **filters)
        expected = ledger_sums(world.tenant, query, [group_by])
        rows = selectors.usage_rows(tenant=world.tenant, query=query)
        assert [r["key"] for r in rows] == sorted(k[0] for k in expected), group_by
        for row in rows:
            want = expected[(row["key"],)]
            for field in ("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount"):
                assert row[field] == want[field], (group_by, row["key"], field)
            assert isinstance(row["amount"], Decimal)
            assert row["currency"] == "USD"

        days, series = selectors.daily_by_group(tenant=world.tenant, query=query)
        assert days == [(usage["first_day"] + timedelta(days=n)).isoformat() for n in range(4)]
        per_day = ledger_sums(world.tenant, query, ["day", group_by])
        assert set(series) == {k[1] for k in per_day}
        for key, values in series.items():
            for day, value in zip(days, values, strict=True):
                cell = per_day.get((day, key))
                assert value == (cell["amount"] if cell else 0), (group_by, key, day)

    query = CostQuery(start=base.start, end=base.end, **filters)
    by_job = ledger_sums(world.tenant, query, ["r.job_ref", "job"])
    top = selectors.top_jobs(tenant=world.tenant, query=query, limit=3)
    expected_top = sorted(by_job.items(), key=lambda item: -item[1]["amount"])[:3]
    assert [(str(t["job_ref"]), t["job_name"], t["amount"]) for t in top] == [
        (*key, v["amount"]) for key, v in expected_top
    ]
    by_tier = ledger_sums(world.tenant, query, ["tier"])
    split = selectors.tier_split(tenant=world.tenant, query=query)
    assert split["by_tier"] == {k[0]: v["amount"] for k, v in by_tier.items()}
    spot = by_tier.get(("spot",))
    assert split["spot_savings"] == (spot["on_demand_amount"] - spot["amount"] if spot else 0)
    assert split["all_savings"] == sum(
        (v["on_demand_amount"] - v["amount"] for v in by_tier.values()), Decimal(0)
    )


def test_the_running_hour_held_by_meters_is_in_every_figure(usage, world):
    """Usage of the hour still running is in the jobs' meters, not yet in rollup rows:
    every figure by job, and every other, still equals the ledger."""
    last_day = datetime.combine(usage["last_day"], datetime.min.time(), tzinfo=UTC)
    job = make_job(world, name="live-run", cpus=4, start=last_day + timedelta(hours=6, minutes=10))
    set_status(job, JobStatus.RUNNING, last_day + timedelta(hours=6, minutes=10))
    meter_tick(now=last_day + timedelta(hours=6, minutes=40))
    assert JobMeter.objects.get(job=job).hour == last_day + timedelta(hours=6)
    assert not UsageRollup.objects.filter(job_ref=job.pk).exists()
    for filters in FILTERS:
        check_against_the_ledger(world, usage, filters)
    rows = selectors.usage_rows(tenant=world.tenant, query=replace(usage["query"], group_by="job"))
    assert {r["key"]: r["cpu_seconds"] for r in rows}["live-run"] == 4 * 30 * 60


def test_a_range_read_partly_from_monthly_rows_still_equals_the_ledger(usage, world):
    """From the 1st of the month the explorer reads the month's row for the closed days
    (the ticks ran into the fourth day) and daily rows after them."""
    month_start = usage["query"].start.replace(day=1)
    mark = MonthlyRollupMark.objects.get().rolled_until
    assert month_start < mark < usage["query"].end
    assert UsageRollup.objects.filter(bucket="month", bucket_start=month_start).exists()
    for group_by in GROUPS:
        query = CostQuery(start=month_start, end=usage["query"].end, group_by=group_by)
        expected = ledger_sums(world.tenant, query, [group_by])
        rows = selectors.usage_rows(tenant=world.tenant, query=query)
        assert {r["key"]: r["amount"] for r in rows} == {
            k[0]: v["amount"] for k, v in expected.items()
        }, group_by
    query = CostQuery(start=month_start, end=usage["query"].end)
    by_job = ledger_sums(world.tenant, query, ["r.job_ref", "job"])
    top = selectors.top_jobs(tenant=world.tenant, query=query)
    assert {(str(t["job_ref"]), t["job_name"]): t["amount"] for t in top} == {
        key: v["amount"] for key, v in by_job.items()
    }


DAY = timedelta(days=1)
FIRST_DAY = datetime(2025, 1, 1, tzinfo=UTC)
days_after = st.integers(min_value=0, max_value=800).map(lambda n: FIRST_DAY + n * DAY)


@given(start=days_after, length=st.integers(1, 731), mark=st.none() | days_after)
def test_monthly_and_daily_rows_cover_a_range_exactly_once(start, length, mark):
    end = start + length * DAY
    counted: dict[datetime, int] = defaultdict(int)
    for bucket, since, until, sign in selectors.covering(start, end, mark):
        if bucket == "month":
            # A month's row: its days from the 1st up to the mark, ending inside the range.
            assert since.day == 1 and until <= end and sign == 1
            assert until == min(mark, (since + timedelta(days=32)).replace(day=1))
        else:
            assert sign == 1 or (since.day == 1 and until == start)  # days before the range
        day = since
        while day < until:
            counted[day] += sign
            day += DAY
    assert {day for day, count in counted.items() if count} == {
        start + n * DAY for n in range(length)
    }
    assert all(count in (0, 1) for count in counted.values())


def test_many_groups_stack_the_costliest_and_one_other_with_the_same_daily_totals(
    usage, world, monkeypatch
):
    """With more groups than the chart stacks, only the costliest are read by day; one
    "Other (n)" is each day's total less theirs."""
    query = replace(usage["query"], group_by="job")
    monkeypatch.setattr(selectors, "MAX_STACKED_SERIES", 3)  # five jobs: two and "Other (3)"
    explorer = selectors.cost_explorer(tenant=world.tenant, query=query)
    _, every = selectors.daily_by_group(tenant=world.tenant, query=query)
    totals = {key: sum(values) for key, values in every.items()}
    costliest = sorted(totals, key=lambda key: (-totals[key], key))[:2]
    assert list(explorer.series) == [*sorted(costliest), "Other (3)"]
    for key in costliest:
        assert explorer.series[key] == every[key]
    for day in range(len(explorer.days)):
        assert sum(values[day] for values in explorer.series.values()) == sum(
            values[day] for values in every.values()
        )


def test_spot_saves_against_on_demand(usage, world):
    split = selectors.tier_split(tenant=world.tenant, query=usage["query"])
    assert split["spot_savings"] > 0  # the demo book gives spot 55 % off
    assert split["by_tier"]["spot"] > 0 and split["by_tier"]["on_demand"] > 0


def test_value_per_gpu_hour_and_per_pflop_uses_the_gpu_types_tflops(usage, world):
    sums = ledger_sums(world.tenant, usage["query"], ["gpu_type"])
    rows = selectors.cost_explorer(tenant=world.tenant, query=usage["query"]).value
    assert [r["gpu_type"] for r in rows] == ["a100-80gb", "h100-80gb", "l40s"]  # no "cpu"
    tflops = dict(GpuType.objects.values_list("slug", "peak_tflops"))
    for row in rows:
        want = sums[(row["gpu_type"],)]
        gpu_hours = want["gpu_seconds"] / HOUR
        assert row["amount"] == want["amount"]
        assert row["gpu_hours"] == gpu_hours
        assert row["per_gpu_hour"] == want["amount"] / gpu_hours
        assert row["per_pflop_hour"] == row["per_gpu_hour"] * 1000 / tflops[row["gpu_type"]]
    h100 = next(r for r in rows if r["gpu_type"] == "h100-80gb")
    # On demand, unpaused: exactly the book's price per GPU-hour (2.99), per PFLOP 2.99/0.9894.
    assert h100["per_gpu_hour"].quantize(Decimal("0.000001")) == Decimal("2.990000")
    assert h100["per_pflop_hour"].quantize(Decimal("0.0001")) == Decimal("3.0220")


def test_other_tenants_usage_never_shows(usage, world, other_world):
    rows = selectors.usage_rows(
        tenant=world.tenant, query=CostQuery(usage["query"].start, usage["query"].end, "job")
    )
    assert "llama-intruder" not in {r["key"] for r in rows}
    theirs = selectors.usage_rows(
        tenant=other_world.tenant, query=CostQuery(usage["query"].start, usage["query"].end, "job")
    )
    assert [r["key"] for r in theirs] == ["llama-intruder"]


# --- the page ----


def page_params(usage, **extra) -> dict:
    return {
        "range": "custom",
        "start": usage["first_day"].isoformat(),
        "end": usage["last_day"].isoformat(),
        **extra,
    }


def table_rows(html: str) -> list[list[str]]:
    table = re.search(r'<table class="table" data-testid="cost-table">(.*?)</table>', html, re.S)
    assert table, "no cost table on the page"
    body = table.group(1).split("<tbody>", 1)[1]
    return [
        [
            unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)
        ]
        for tr in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def figure(html: str, figure_id: str) -> dict:
    found = re.search(
        rf'<script id="{figure_id}" type="application/json">(.*?)</script>', html, re.S
    )
    assert found, f"no {figure_id} on the page"
    return json.loads(found.group(1))


def test_the_page_renders_for_each_group_by(usage, world, django_assert_max_num_queries):
    client = signed_in_client(world.viewer, world.tenant)  # every member may look
    for group_by in GROUPS:
        with django_assert_max_num_queries(60):
            response = client.get("/billing/costs/", page_params(usage, group_by=group_by))
        check_the_page(response, usage, world, group_by)


def group_names(group_by: str) -> dict[str, str]:
    if group_by == "gpu_type":
        return {**dict(GpuType.objects.values_list("slug", "model")), "cpu": "CPU"}
    return dict(Tier.choices) if group_by == "tier" else {}


def check_the_page(response, usage, world, group_by: str) -> None:
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html and 'id="explorer"' in html
    query = CostQuery(usage["query"].start, usage["query"].end, group_by)
    rows = selectors.usage_rows(tenant=world.tenant, query=query)
    # Groups by their display names: "A100 80GB SXM" for a100-80gb, "On-demand".
    names = group_names(group_by)
    assert [r[0] for r in table_rows(html)] == [names.get(r["key"], r["key"]) for r in rows]
    # The daily chart has one stacked trace per group, with the selector's numbers.
    days, series = selectors.daily_by_group(tenant=world.tenant, query=query)
    daily = figure(html, "fig-daily")
    assert [t["name"] for t in daily["data"]] == [names.get(key, key) for key in series]
    for trace, key in zip(daily["data"], series, strict=True):
        assert trace["x"] == days
        assert trace["y"] == [float(v) for v in series[key]]
    for other in ("fig-tiers", "fig-value", "fig-top"):
        assert has_points(figure(html, other))
    # This month's chart (the usage may lie in another month) draws points or says there
    # are none: never bare axes.
    if 'id="fig-mtd"' in html:
        assert has_points(figure(html, "fig-mtd"))
    else:
        assert 'data-testid="chart-mtd-empty"' in html


def test_the_csv_export_equals_the_table(usage, world):
    client = signed_in_client(world.member, world.tenant)
    for group_by in ("gpu_type", "job", "day"):
        params = page_params(usage, group_by=group_by, region="us-west")
        html = client.get("/billing/costs/", params).content.decode()
        link = unescape(re.search(r'href="([^"]+)" data-testid="csv-export"', html).group(1))
        assert link.startswith("/billing/costs/export.csv?")
        response = client.get(link)  # exactly the page's filters
        assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
        header, *lines = list(csv.reader(io.StringIO(response.content.decode())))
        assert header == [group_by, "gpu_hours", "vcpu_hours", "amount", "currency"]
        table = table_rows(html)
        names = group_names(group_by)  # the file keeps the keys, the page shows names
        assert [names.get(line[0], line[0]) for line in lines] == [row[0] for row in table]
        for line, row in zip(lines, table, strict=True):
            table_amount, currency = row[3].split()
            assert line[4] == currency == "USD"
            # The same figures, at the table's (money: cents) and the file's precisions.
            table_amount = table_amount.replace(",", "")
            assert abs(Decimal(line[3]) - Decimal(table_amount)) <= Decimal("0.0050005")
            assert len(table_amount.split(".")[1]) == 2
            assert abs(Decimal(line[1]) - Decimal(row[1])) <= Decimal("0.0005005")
            assert abs(Decimal(line[2]) - Decimal(row[2])) <= Decimal("0.0005005")
        rows = selectors.usage_rows(
            tenant=world.tenant,
            query=CostQuery(usage["query"].start, usage["query"].end, group_by, region="us-west"),
        )
        assert [Decimal(line[3]) for line in lines] == [
            r["amount"].quantize(Decimal("0.000001")) for r in rows
        ]


def test_htmx_gets_only_the_explorer_partial(usage, world):
    client = signed_in_client(world.member, world.tenant)
    response = client.get(
        "/billing/costs/", page_params(usage, group_by="tier"), HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="explorer">')
    assert "<html" not in html and "<form" not in html
    assert [r[0] for r in table_rows(html)] == ["On-demand", "Spot"]  # tiers by their labels
    assert figure(html, "fig-daily")["data"]
    assert "<h2>Daily cost by tier</h2>" in html
    gpu = client.get(
        "/billing/costs/", page_params(usage, group_by="gpu_type"), HTTP_HX_REQUEST="true"
    )
    html = gpu.content.decode()
    assert "<h2>Daily cost by GPU type</h2>" in html and "gputype" not in html
    assert '<th scope="col">GPU type</th>' in html
    assert re.search(r'data-testid="cost-total">\d[\d,]*\.\d\d USD<', html)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"range": "custom", "start": "2026-03-10", "end": "2026-03-01"}, "end date is before"),
        ({"range": "custom", "start": "2024-01-01", "end": "2026-03-01"}, "at most two years"),
        ({"range": "custom", "start": "2026-03-01"}, "Give a start and an end date"),
        ({"range": "this_month", "group_by": "colour"}, "Select a valid choice"),
        ({"range": "fortnight"}, "Select a valid choice"),
        # A GPU type is picked from the catalog's, not typed ("A100" used to give 0.00).
        ({"range": "this_month", "gpu_type": "A100"}, "Select a valid choice"),
        ({"range": "this_month", "region": "mars"}, "Select a valid choice"),
        ({"range": "custom", "start": "yesterday", "end": "2026-03-01"}, "Enter a valid date"),
        # The end of the calendar (was a 500: the day after it can't be computed).
        ({"range": "custom", "start": "9999-12-31", "end": "9999-12-31"}, "Dates go up to"),
        ({"range": "custom", "start": "9998-12-01", "end": "9999-01-01"}, "Dates go up to"),
    ],
)
def test_bad_filters_are_form_errors(world, catalog, params, message):
    client = signed_in_client(world.member, world.tenant)
    response = client.get("/billing/costs/", params)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="flash flash-error" role="alert"' in html
    assert message in unescape(html)
    assert "cost-table" not in html and "fig-daily" not in html
    export = client.get("/billing/costs/export.csv", params)
    assert export.status_code == 400
    assert message in export.content.decode()


@pytest.mark.parametrize("group_by", list(selectors.GROUP_BY))
def test_the_last_day_a_range_may_hold_is_shown_and_exported(world, catalog, group_by):
    last = selectors.LAST_DAY.isoformat()
    params = {"range": "custom", "start": last, "end": last, "group_by": group_by}
    client = signed_in_client(world.member, world.tenant)
    page = client.get("/billing/costs/", params)
    assert page.status_code == 200
    assert "flash-error" not in page.content.decode()
    export = client.get("/billing/costs/export.csv", params)
    assert export.status_code == 200
    assert export.content.decode().splitlines()[0].startswith(group_by)


START = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        (CostQuery(START, START - timedelta(days=1)), "end"),
        (CostQuery(START, START + timedelta(days=800)), "end"),
        (CostQuery(START, START + timedelta(days=1), group_by="colour"), "group_by"),
    ],
    ids=["reversed", "over-two-years", "unknown-group-by"],
)
def test_selectors_refuse_bad_queries(world, catalog, query, field):
    for selector in (selectors.usage_rows, selectors.daily_by_group, selectors.top_jobs):
        with pytest.raises(ServiceError) as refused:
            selector(tenant=world.tenant, query=query)
        assert refused.value.field == field


def test_gpu_type_and_region_filters_offer_the_catalog(world, catalog):
    html = signed_in_client(world.member, world.tenant).get("/billing/costs/").content.decode()
    gpu_select = html.split('name="gpu_type"', 1)[1].split("</select>", 1)[0]
    assert '<option value="a100-80gb">' in gpu_select and "A100" in gpu_select
    assert '<option value="cpu">CPU only</option>' in gpu_select
    region_select = html.split('name="region"', 1)[1].split("</select>", 1)[0]
    assert '<option value="us-west">' in region_select
