"""The Cost Explorer's figures are written as plain dicts (see billing/charts.py); here
plotly.py's own schema validates them, so they stay figures plotly.js can draw. Also the
rules every chart shares (console.charts): one colour per GPU type on every page, units
on labelled axes, no empty months or cut labels, nothing drawn without data."""

from __future__ import annotations

import json
from decimal import Decimal

import plotly.graph_objects as go
import pytest

from billing import charts
from billing.finance import charts as finance_charts
from console.charts import CPU_COLOUR, has_points
from jobs import metrics
from marketplace.selectors import gpu_type_colours, gpu_type_names
from tests.conftest import signed_in_client
from tests.factories import GpuTypeFactory

ROWS = [
    {"gpu_type": "a100-80gb", "per_gpu_hour": Decimal("1.79"), "per_pflop_hour": Decimal("5.7")},
    {"gpu_type": "h100-80gb", "per_gpu_hour": Decimal("2.99"), "per_pflop_hour": None},
]
FIGURES = {
    "daily": charts.daily_stacked(
        ["2026-11-01", "2026-11-02"],
        {"h100-80gb": [Decimal("1.5"), Decimal(0)], "cpu": [Decimal("0.1"), Decimal("0.2")]},
        "USD",
    ),
    "mtd": charts.month_to_date(
        ["2026-11-01", "2026-11-02"],
        [Decimal(1), Decimal(3)],
        Decimal(100),
        Decimal(45),
        "2026-11-30",
        "USD",
    ),
    "mtd without budget or days": charts.month_to_date(
        [], [], None, Decimal(0), "2026-11-30", "EUR"
    ),
    "tiers": charts.tier_share({"spot": Decimal(2), "on_demand": Decimal(5)}),
    "value": charts.value_bars(ROWS, "USD"),
    "top": charts.top_jobs_bar(
        [{"job_name": "bert", "job_ref": 7, "amount": Decimal("12.5")}], "USD"
    ),
}


@pytest.mark.parametrize("name", FIGURES)
def test_figures_are_valid_plotly_json(name):
    figure = FIGURES[name]
    json.dumps(figure)  # plain JSON: no Decimal, no numpy
    # Raises ValueError on any property plotly.js doesn't know.
    validated = go.Figure(figure)
    assert len(validated.data) == len(figure["data"])
    assert validated.layout.height >= charts.LAYOUT["height"]


def test_stacked_daily_chart_keeps_one_trace_per_group_in_order():
    figure = FIGURES["daily"]
    assert figure["layout"]["barmode"] == "stack"
    assert [(t["name"], t["y"]) for t in figure["data"]] == [
        ("h100-80gb", [1.5, 0.0]),
        ("cpu", [0.1, 0.2]),
    ]
    assert figure["layout"]["yaxis"]["title"]["text"] == "USD"


# --- issue 32, item 8: units, colours, empty states, no cut labels --------------------------


def test_value_chart_puts_each_unit_on_its_own_labelled_axis():
    figure = FIGURES["value"]
    per_gpu_hour, per_pflop_hour = figure["data"]
    assert (per_gpu_hour["yaxis"], per_pflop_hour["yaxis"]) == ("y", "y2")
    assert figure["layout"]["yaxis"]["title"]["text"] == "USD / GPU-hour"
    assert figure["layout"]["yaxis2"]["title"]["text"] == "USD / PFLOP-hour"
    # Domains apart: two panels, not one axis mixing both.
    assert figure["layout"]["yaxis"]["domain"][0] > figure["layout"]["yaxis2"]["domain"][1]
    assert per_pflop_hour["y"] == [5.7, None]  # unknown stays a gap, not a 0 bar


def test_every_axis_makes_room_for_its_labels():
    # A job's name on the top-jobs bar was cut to "-04 #222" by a fixed left margin.
    for figure in FIGURES.values():
        axes = [v for k, v in figure["layout"].items() if k.startswith(("xaxis", "yaxis"))]
        assert axes and all(axis["automargin"] is True for axis in axes)
    top = charts.top_jobs_bar(
        [{"job_name": "run-2026-12-04-llama-70b", "job_ref": 222, "amount": Decimal(1)}], "USD"
    )
    assert top["data"][0]["y"] == ["run-2026-12-04-llama-70b #222"]  # whole, not shortened


def test_empty_figures_have_no_points_and_a_figure_with_data_has():
    assert has_points(FIGURES["daily"]) and has_points(FIGURES["top"])
    assert not has_points(FIGURES["mtd without budget or days"])
    assert not has_points(charts.top_jobs_bar([], "USD"))
    assert not has_points(charts.daily_stacked(["2026-11-01"], {"cpu": [Decimal(0)]}, "USD"))
    assert not has_points(charts.tier_share({}))
    assert not has_points(None)


def test_revenue_months_start_and_end_with_the_data():
    months = [f"2026-{m:02d}" for m in range(1, 13)]
    zero = [Decimal(0)] * 12
    a100 = list(zero)
    a100[3], a100[5] = Decimal(10), Decimal(5)
    cpu = list(zero)
    cpu[4] = Decimal(1)
    figure = finance_charts.monthly_stacked(months, {"A100": a100, "CPU": cpu}, "USD")
    assert [t["x"] for t in figure["data"]] == [["2026-04", "2026-05", "2026-06"]] * 2
    assert figure["data"][0]["y"] == [10.0, 0.0, 5.0]
    assert figure["layout"]["xaxis"]["automargin"] is True
    assert finance_charts.monthly_stacked(months, {"A100": zero}, "USD")["data"][0]["x"] == []


@pytest.mark.django_db
def test_a_gpu_type_has_one_colour_on_every_chart(catalog):
    colours = gpu_type_colours()
    by_name = gpu_type_colours(by_name=True)
    names = gpu_type_names()
    slugs = sorted(names)[:3]
    assert len({colours[slug] for slug in slugs}) == 3
    # Cost Explorer: daily cost by GPU type and the value chart.
    daily = charts.daily_stacked(
        ["2026-11-01"], {slug: [Decimal(1)] for slug in slugs}, "USD", names, colours
    )
    assert [t["marker"]["color"] for t in daily["data"]] == [colours[s] for s in slugs]
    rows = [{"gpu_type": s, "per_gpu_hour": Decimal(1), "per_pflop_hour": None} for s in slugs]
    value = charts.value_bars(rows, "USD", names, colours)
    assert value["data"][0]["marker"]["color"] == [colours[s] for s in slugs]
    # Finance: series labelled by name get the same colours.
    monthly = finance_charts.monthly_stacked(
        ["2026-11"], {names[s]: [Decimal(1)] for s in slugs}, "USD", by_name
    )
    assert [t["marker"]["color"] for t in monthly["data"]] == [colours[s] for s in slugs]
    # The job page: the mean line of a many-GPU job.
    job_figure = metrics.job_figures(
        [
            {"at": "2026-11-01T00:00:00+00:00", "node": "rank 0", "gpu": g, "utilization": 1.0}
            | {"memory_used_mib": 1.0, "power_w": 1.0, "temperature_c": 1.0}
            for g in range(9)
        ],
        colour=colours[slugs[0]],
    )["utilization"]
    assert job_figure["data"][2]["line"]["color"] == colours[slugs[0]]
    # A new GPU type takes the next colour; none of the others changes.
    GpuTypeFactory(slug="zz-new-gpu")
    again = gpu_type_colours()
    assert {slug: again[slug] for slug in colours} == colours
    assert colours["cpu"] == CPU_COLOUR


@pytest.mark.django_db
def test_cost_explorer_without_usage_says_so_instead_of_drawing_axes(world, catalog):
    client = signed_in_client(world.viewer, world.tenant)
    html = client.get("/billing/costs/", {"range": "this_month"}).content.decode()
    for testid in ("chart-daily", "chart-mtd", "chart-tiers", "chart-top"):
        assert f'data-testid="{testid}-empty"' in html
    assert "data-figure-id" not in html and "No cost in this range" in html
