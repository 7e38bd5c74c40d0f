"""`make bench`: every benchmark against the production topology, then one table.

    make bench              # the issue's sizes (tens of minutes)
    make bench SIZE=smoke   # small sizes, a few minutes (CI runs this)

Each benchmark runs as its own pytest process (a fresh server and database each) and
records its figures (tests/bench/results.py); this prints them as one table and keeps
them in var/bench/results.json and var/bench/table.md. It needs PostgreSQL and Redis:
DATABASE_URL and REDIS_URL, by default the local ones CI uses. It fails only when a
benchmark fails to run or records nothing, never because a target is missed.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.results import RESULTS

ROOT = Path(__file__).resolve().parents[2]
BENCHES = [
    ("api", "tests/bench/api/bench_api.py"),
    ("launch", "tests/bench/api/bench_launch.py"),
    ("dispatch", "tests/bench/dispatch/bench_dispatch.py"),
    ("dispatch", "tests/bench/dispatch/bench_dispatch_sustained.py"),
    ("metering", "tests/bench/metering/bench_metering.py"),
    ("costs", "tests/bench/costs/bench_cost_explorer.py"),
    ("costs", "tests/bench/costs/bench_budget_reaction.py"),
    ("streaming", "tests/bench/streaming/test_streaming.py"),
    ("queue", "tests/bench/queue/bench_runtime_prediction.py"),
    ("scheduler", "tests/bench/queue/bench_scheduler.py"),
    ("services", "tests/bench/services/bench_gateway.py"),
    ("pages", "tests/bench/pages/bench_job_page.py"),
]
SMOKE_ENV = {
    "GPUGEEK_BENCH_JOBS": "20",
    "GPUGEEK_BENCH_SECONDS": "10",
    "GPUGEEK_BENCH": "smoke",
}


def machine() -> str:
    return f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform(terse=True)}"


def table(rows: list[dict]) -> str:
    lines = [
        "| benchmark | figure | value | target | baseline | ratio | met |",
        "| --- | --- | ---: | --- | --- | ---: | --- |",
    ]
    for row in rows:
        met = {True: "yes", False: "**no**", None: ""}[row["met"]]
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.0%}"
        lines.append(
            f"| {row['bench']} | {row['figure']} | {row['value']:,.1f} {row['unit']} | "
            f"{row['target']} | {row['baseline']} | {ratio} | {met} |"
        )
    return "\n".join(lines)


def main() -> int:
    size = os.environ.get("GPUGEEK_BENCH_SIZE", "full")
    env = dict(os.environ)
    env.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpugeek")
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    if size == "smoke":
        env.update({key: value for key, value in SMOKE_ENV.items() if key not in os.environ})
    else:
        env.setdefault("GPUGEEK_BENCH", "full")
    RESULTS.unlink(missing_ok=True)
    failed = []
    started = time.monotonic()
    for name, path in BENCHES:
        print(f"\n=== {name}: {path} ({size}) ===", flush=True)
        code = subprocess.call(
            [sys.executable, "-m", "pytest", path, "-p", "no:cacheprovider", "-s", "-q"],
            cwd=ROOT,
            env=env,
        )
        if code != 0:
            failed.append(path)
    rows = (
        [json.loads(line) for line in RESULTS.read_text().splitlines()] if RESULTS.exists() else []
    )
    missing = {name for name, _ in BENCHES} - {row["bench"] for row in rows}
    out = RESULTS.parent
    (out / "results.json").write_text(
        json.dumps({"size": size, "machine": machine(), "rows": rows}, indent=1)
    )
    text = table(rows)
    (out / "table.md").write_text(f"{size} size, {machine()}\n\n{text}\n")
    print(f"\nBenchmarks ({size} size, {machine()}, {time.monotonic() - started:.0f} s)\n")
    print(text)
    print(f"\n(also in {out / 'table.md'} and {out / 'results.json'})")
    if failed or missing:
        print(
            f"FAILED: {failed or ''} {'no figures from ' + str(sorted(missing)) if missing else ''}"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
