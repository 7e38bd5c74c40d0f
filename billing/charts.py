"""Plotly figures for the Cost Explorer, built on the server (plotly.py) and handed to
plotly.js as JSON (dicts, embedded with json_script)."""

from __future__ import annotations

import json
from decimal import Decimal

import plotly.graph_objects as go

LAYOUT = {
    "margin": {"l": 50, "r": 10, "t": 30, "b": 40},
    "height": 320,
    "legend": {"orientation": "h", "y": -0.2},
    "paper_bgcolor": "rgba(0,0,0,0)",
    "plot_bgcolor": "rgba(0,0,0,0)",
    "font": {"size": 12},
}


def _floats(values) -> list[float]:
    return [float(v) for v in values]


def daily_stacked(days: list[str], series: dict[str, list[Decimal]], currency: str) -> dict:
    fig = go.Figure([go.Bar(name=key, x=days, y=_floats(values)) for key, values in series.items()])
    fig.update_layout(barmode="stack", yaxis_title=currency, **LAYOUT)
    return json.loads(fig.to_json())


def month_to_date(
    days: list[str],
    cumulative: list[Decimal],
    budget: Decimal | None,
    forecast: Decimal | None,
    month_end: str,
    currency: str,
) -> dict:
    fig = go.Figure(
        [go.Scatter(name="Spend to date", x=days, y=_floats(cumulative), mode="lines+markers")]
    )
    if forecast is not None and days:
        fig.add_trace(
            go.Scatter(
                name="Forecast",
                x=[days[-1], month_end],
                y=[float(cumulative[-1]) if cumulative else 0, float(forecast)],
                mode="lines",
                line={"dash": "dot"},
            )
        )
    if budget is not None:
        fig.add_trace(
            go.Scatter(
                name="Budget",
                x=[days[0] if days else month_end, month_end],
                y=[float(budget)] * 2,
                mode="lines",
                line={"color": "#c92a2a"},
            )
        )
    fig.update_layout(yaxis_title=currency, **LAYOUT)
    return json.loads(fig.to_json())


def tier_share(by_tier: dict[str, Decimal]) -> dict:
    fig = go.Figure([go.Pie(labels=list(by_tier), values=_floats(by_tier.values()), hole=0.5)])
    fig.update_layout(**LAYOUT)
    return json.loads(fig.to_json())


def value_bars(rows: list[dict], currency: str) -> dict:
    names = [r["gpu_type"] for r in rows]
    fig = go.Figure(
        [
            go.Bar(
                name=f"{currency} per GPU-hour",
                x=names,
                y=[float(r["per_gpu_hour"] or 0) for r in rows],
            ),
            go.Bar(
                name=f"{currency} per PFLOP-hour",
                x=names,
                y=[float(r["per_pflop_hour"] or 0) for r in rows],
            ),
        ]
    )
    fig.update_layout(barmode="group", **LAYOUT)
    return json.loads(fig.to_json())


def top_jobs_bar(rows: list[dict], currency: str) -> dict:
    fig = go.Figure(
        [
            go.Bar(
                x=[float(r["amount"]) for r in rows][::-1],
                y=[f"{r['job_name']} #{r['job_ref']}" for r in rows][::-1],
                orientation="h",
            )
        ]
    )
    fig.update_layout(xaxis_title=currency, **LAYOUT)
    return json.loads(fig.to_json())
