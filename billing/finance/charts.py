"""Plotly figures of the finance console, built on the server like the Cost Explorer's
(`billing/charts.py`: plain Plotly JSON, labels a tenant chose HTML-escaped). Amounts
arrive as Decimals and become floats only here, as the figure is written."""

from __future__ import annotations

from decimal import Decimal
from typing import cast

from billing import charts
from billing.finance.revenue import PoolUtilisation, TenantRevenue
from billing.finance.selectors import Ageing

# The Cost Explorer's escaping of labels a tenant chose: one rule, reused.
_label = charts._label


def _figure(data: list[dict], **layout) -> dict:
    return {"data": data, "layout": {**charts.LAYOUT, **layout}}


def monthly_stacked(months: list[str], series: dict[str, list[Decimal]], unit: str) -> dict:
    """Stacked bars per month, one trace per group (GPU type, tier)."""
    return _figure(
        [
            {"type": "bar", "name": _label(name), "x": months, "y": [float(v) for v in values]}
            for name, values in series.items()
        ],
        barmode="stack",
        xaxis={"type": "category"},
        yaxis={"title": {"text": unit}},
    )


def tier_split(totals: dict[str, Decimal]) -> dict:
    """Spot, on-demand and reserved revenue over the period (a donut)."""
    return charts.tier_share(totals)


def top_tenants_bar(rows: list[TenantRevenue], currency: str) -> dict:
    return _figure(
        [
            {
                "type": "bar",
                "orientation": "h",
                "x": [float(row.amount) for row in rows][::-1],
                "y": [_label(f"{row.name} ({row.slug})") for row in rows][::-1],
            }
        ],
        xaxis={"title": {"text": currency}},
        margin={**cast(dict, charts.LAYOUT["margin"]), "l": 160},  # room for names
    )


def utilisation_bar(rows: list[PoolUtilisation]) -> dict:
    """Percent of capacity sold per pool group that has capacity now."""
    shown = [(row, row.percent) for row in rows if row.percent is not None]
    return _figure(
        [
            {
                "type": "bar",
                "x": [_label(row.label) for row, _ in shown],
                "y": [float(percent) for _, percent in shown],
                "hovertext": [_label(row.pools) for row, _ in shown],
            }
        ],
        xaxis={"type": "category"},
        yaxis={"title": {"text": "% of capacity"}, "rangemode": "tozero"},
    )


def ageing_bar(ageing: Ageing) -> dict:
    """Amounts past due per ageing bucket."""
    return _figure(
        [
            {
                "type": "bar",
                "x": [bucket.label for bucket in ageing.buckets],
                "y": [float(bucket.amount) for bucket in ageing.buckets],
                "text": [f"{bucket.count} invoice(s)" for bucket in ageing.buckets],
            }
        ],
        xaxis={"type": "category", "title": {"text": "days past due"}},
        yaxis={"title": {"text": ageing.currency}},
    )
