"""Benchmark figures, collected into one table by `make bench` (tests/bench/run.py).

Each benchmark calls `record(...)` for the figures it measures; they are appended to
`var/bench/results.jsonl`, which the runner clears before and reads after the run."""

from __future__ import annotations

import json
import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "var" / "bench" / "results.jsonl"


def bench_size() -> str:
    """ "smoke" (CI: small sizes, a couple of minutes) or "full" (the issue's sizes)."""
    return os.environ.get("GPUGEEK_BENCH_SIZE", "full")


def record(
    bench: str,
    figure: str,
    value: float,
    unit: str,
    *,
    target: str = "",
    baseline: str = "",
    ratio: float | None = None,
    met: bool | None = None,
) -> None:
    """One figure: `target` says what it should be, `baseline` what it is compared with
    (measured in the same run), `ratio` the figure over that baseline, `met` whether the
    target holds (None: no target)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    row = {
        "bench": bench,
        "figure": figure,
        "value": round(value, 3),
        "unit": unit,
        "target": target,
        "baseline": baseline,
        "ratio": None if ratio is None else round(ratio, 3),
        "met": met,
        "size": bench_size(),
    }
    with RESULTS.open("a") as out:
        out.write(json.dumps(row) + "\n")
