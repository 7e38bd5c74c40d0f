"""Plotly figures for the Cost Explorer, built on the server and handed to plotly.js as
JSON (dicts, embedded with json_script).

The figures are written as plain Plotly JSON (`{"data": [traces], "layout": {...}}`, the
schema plotly.js reads) rather than through `plotly.graph_objects`, whose validation of
every property costs more than the database work of a page with hundreds of traces;
`tests/billing/test_charts.py` validates them against plotly.py's schema instead.

Plotly renders a subset of HTML in trace names, legend entries, tick labels and hover
text (`<a href>` makes a clickable link), so every label that comes from a name a tenant
chose (job, project, group keys) goes through `_label`, which HTML-escapes it; plotly.js
shows the escaped entities as the literal characters.
"""

from __future__ import annotations

from decimal import Decimal
from html import escape

from console.charts import fit_axes, palette_colour
from marketplace.models import Tier

# The ledger's tiers: compute's ("on_demand" → "On-demand"), volumes' and services' replicas'.
TIER_LABELS = {**dict(Tier.choices), "storage": "Storage", "service": "Services"}

LAYOUT = {
    "margin": {"l": 50, "r": 10, "t": 30, "b": 40},
    "height": 320,
    "legend": {"orientation": "h", "y": -0.2},
    "paper_bgcolor": "rgba(0,0,0,0)",
    "plot_bgcolor": "rgba(0,0,0,0)",
    "font": {"size": 12},
}


def _label(text) -> str:
    return escape(str(text), quote=False)


def _floats(values) -> list[float]:
    return [float(v) for v in values]


def _figure(data: list[dict], **layout) -> dict:
    return {"data": data, "layout": fit_axes({**LAYOUT, **layout})}


def _axis_title(text: str) -> dict:
    return {"title": {"text": text}}


def daily_stacked(
    days: list[str],
    series: dict[str, list[Decimal]],
    currency: str,
    names: dict[str, str] | None = None,
    colours: dict[str, str] | None = None,
) -> dict:
    """Daily cost stacked by group; `names` are the groups' display names (a GPU type's
    "A100 80GB SXM" for its slug, "On-demand" for on_demand) where they have one, and
    `colours` their colours where they have one (a GPU type's, the same on every page)."""
    names, colours = names or {}, colours or {}
    return _figure(
        [
            {
                "type": "bar",
                "name": _label(names.get(key, key)),
                "x": days,
                "y": _floats(values),
                **({"marker": {"color": colours[key]}} if key in colours else {}),
            }
            for key, values in series.items()
        ],
        barmode="stack",
        yaxis=_axis_title(currency),
    )


def month_to_date(
    days: list[str],
    cumulative: list[Decimal],
    budget: Decimal | None,
    forecast: Decimal | None,
    month_end: str,
    currency: str,
) -> dict:
    traces = [
        {
            "type": "scatter",
            "name": "Spend to date",
            "x": days,
            "y": _floats(cumulative),
            "mode": "lines+markers",
        }
    ]
    if forecast is not None and days:
        traces.append(
            {
                "type": "scatter",
                "name": "Forecast",
                "x": [days[-1], month_end],
                "y": [float(cumulative[-1]) if cumulative else 0.0, float(forecast)],
                "mode": "lines",
                "line": {"dash": "dot"},
            }
        )
    if budget is not None:
        traces.append(
            {
                "type": "scatter",
                "name": "Budget",
                "x": [days[0] if days else month_end, month_end],
                "y": [float(budget)] * 2,
                "mode": "lines",
                "line": {"color": "#c92a2a"},
            }
        )
    return _figure(traces, yaxis=_axis_title(currency))


def tier_share(by_tier: dict[str, Decimal]) -> dict:
    return _figure(
        [
            {
                "type": "pie",
                "labels": [_label(TIER_LABELS.get(tier, tier)) for tier in by_tier],
                "values": _floats(by_tier.values()),
                "hole": 0.5,
            }
        ]
    )


def value_bars(
    rows: list[dict],
    currency: str,
    gpu_names: dict[str, str] | None = None,
    colours: dict[str, str] | None = None,
) -> dict:
    """Price per GPU-hour and per PFLOP-hour by GPU type: two stacked panels sharing the
    GPU types, each on its own labelled axis (the units differ by a factor of ten or
    more, one axis would flatten one of them). Bars in each GPU type's colour."""
    names = [_label((gpu_names or {}).get(r["gpu_type"], r["gpu_type"])) for r in rows]
    bar_colours = [(colours or {}).get(r["gpu_type"], palette_colour(0)) for r in rows]

    def panel(field: str, unit: str, axis: str) -> dict:
        return {
            "type": "bar",
            "name": f"{currency} per {unit}",
            "x": names,
            "y": [None if r[field] is None else float(r[field]) for r in rows],
            "xaxis": f"x{axis}",
            "yaxis": f"y{axis}",
            "marker": {"color": bar_colours},
            "hovertemplate": f"%{{x}}: %{{y:.4f}} {currency} per {unit}<extra></extra>",
        }

    return _figure(
        [panel("per_gpu_hour", "GPU-hour", ""), panel("per_pflop_hour", "PFLOP-hour", "2")],
        showlegend=False,
        height=400,
        xaxis={"anchor": "y", "showticklabels": False, "type": "category"},
        yaxis={"domain": [0.58, 1], "title": {"text": f"{currency} / GPU-hour"}},
        xaxis2={"anchor": "y2", "matches": "x", "type": "category"},
        yaxis2={"domain": [0, 0.42], "title": {"text": f"{currency} / PFLOP-hour"}},
    )


def top_jobs_bar(rows: list[dict], currency: str) -> dict:
    return _figure(
        [
            {
                "type": "bar",
                "x": [float(r["amount"]) for r in rows][::-1],
                "y": [_label(f"{r['job_name']} #{r['job_ref']}") for r in rows][::-1],
                "orientation": "h",
                "hovertemplate": f"%{{y}}: %{{x:.2f}} {currency}<extra></extra>",
            }
        ],
        xaxis=_axis_title(currency),
    )
