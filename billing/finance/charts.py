"""Plotly figures of the finance console, built on the server like the Cost Explorer's
(`billing/charts.py`: plain Plotly JSON, labels a tenant chose HTML-escaped). Amounts
arrive as Decimals and become floats only here, as the figure is written."""

from __future__ import annotations

from decimal import Decimal

from billing import charts
from billing.finance.revenue import PoolUtilisation, TenantRevenue
from billing.finance.selectors import Ageing

# The Cost Explorer's escaping of labels a tenant chose: one rule, reused.
_label = charts._label


_figure = charts._figure


def data_months(months: list[str], series: dict[str, list[Decimal]]) -> slice:
    """The months from the first to the last with any amount: a chart of the period
    shows its data, not a row of empty months before and after it."""
    filled = [i for i in range(len(months)) if any(values[i] for values in series.values())]
    return slice(filled[0], filled[-1] + 1) if filled else slice(0, 0)


def monthly_stacked(
    months: list[str],
    series: dict[str, list[Decimal]],
    unit: str,
    colours: dict[str, str] | None = None,
) -> dict:
    """Stacked bars per month, one trace per group (GPU type, tier), over the months that
    have data; `colours` by group name where a group has one (a GPU type's)."""
    shown = data_months(months, series)
    colours = colours or {}
    return _figure(
        [
            {
                "type": "bar",
                "name": _label(name),
                "x": months[shown],
                "y": [float(v) for v in values[shown]],
                **({"marker": {"color": colours[name]}} if name in colours else {}),
            }
            for name, values in series.items()
        ],
        barmode="stack",
        xaxis={"type": "category", "tickangle": -45 if len(months[shown]) > 6 else 0},
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
