"""The Cost Explorer's figures are written as plain dicts (see billing/charts.py); here
plotly.py's own schema validates them, so they stay figures plotly.js can draw."""

from __future__ import annotations

import json
from decimal import Decimal

import plotly.graph_objects as go
import pytest

from billing import charts

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
    assert validated.layout.height == charts.LAYOUT["height"]


def test_stacked_daily_chart_keeps_one_trace_per_group_in_order():
    figure = FIGURES["daily"]
    assert figure["layout"]["barmode"] == "stack"
    assert [(t["name"], t["y"]) for t in figure["data"]] == [
        ("h100-80gb", [1.5, 0.0]),
        ("cpu", [0.1, 0.2]),
    ]
    assert figure["layout"]["yaxis"]["title"]["text"] == "USD"
