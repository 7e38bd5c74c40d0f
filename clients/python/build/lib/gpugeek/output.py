"""Plain aligned tables and JSON for the CLI (no dependencies)."""

from __future__ import annotations

import json
import sys
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
