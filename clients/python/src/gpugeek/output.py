"""Plain aligned tables and JSON for the CLI (no dependencies)."""

from __future__ import annotations

import json
import sys
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any


def table(rows: list[dict[str, Any]], columns: list[str], out=None) -> None:
    out = out or sys.stdout
    if not rows:
        print("(none)", file=out)
        return
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(),
          file=out)  # fmt: skip
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(), file=out)


def pairs(data: dict[str, Any], out=None) -> None:
    out = out or sys.stdout
    width = max((len(k) for k in data), default=0)
    for key, value in data.items():
        print(f"{key.ljust(width)}  {_cell(value)}", file=out)


def money(amount: Any, currency: str = "", places: int = 2) -> str:
    """An amount as the console shows money: `places` decimals (half up), thousands
    grouped, the currency after it ("1,342.54 USD"); "-" for none."""
    if amount is None or amount == "":
        return "-"
    try:
        rounded = Decimal(str(amount)).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP)
    except (InvalidOperation, ValueError):
        return str(amount)
    if rounded.is_zero():
        rounded = rounded.copy_abs()
    text = f"{rounded:,.{places}f}"
    return f"{text} {currency}" if currency else text


def cost_summary(summary: dict[str, Any], out=None) -> None:
    """`gpugeek costs`: the month so far, the run rate, the forecast and each budget,
    as money with its currency."""
    out = out or sys.stdout
    currency = summary.get("currency") or ""
    since = str(summary.get("period_start") or "")[:10]
    pairs(
        {
            f"Month to date (since {since})": money(summary.get("month_to_date"), currency),
            "Run rate": f"{money(summary.get('run_rate_per_hour'), currency)} per hour",
            "Forecast for the month": money(summary.get("forecast"), currency),
        },
        out=out,
    )
    budgets = summary.get("budgets") or []
    print(file=out)
    if not budgets:
        print("No budgets.", file=out)
        return
    rows = [
        {
            "budget": b.get("name"),
            "project": b.get("project") or "(all)",
            "amount": money(b.get("amount"), currency),
            "spent": money(b.get("spend"), currency),
            "used": f"{money(b.get('percent'), places=0)} %",
            "forecast": money(b.get("forecast"), currency),
            "status": b.get("status"),
        }
        for b in budgets
    ]
    table(rows, ["budget", "project", "amount", "spent", "used", "forecast", "status"], out=out)


def dump(data: Any, out=None) -> None:
    print(json.dumps(data, indent=2, default=str), file=out or sys.stdout)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)
