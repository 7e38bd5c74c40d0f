"""Appends `rate` lines per second to each given log file: `<seq> <unix time written>`.

Run as `python -m tests.bench.streaming.writer SECONDS RATE FILE...`; prints the number of
lines written per file and when each line number was written (JSON) when done."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    seconds, rate, paths = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    handles = [open(path, "a", buffering=1) for path in paths]  # noqa: SIM115
    interval = 1.0 / rate
    written = 0
    written_at = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        written += 1
        now = time.time()  # one tick writes line `written` of every file
        written_at.append(now)
        for handle in handles:
            handle.write(f"{written} {now:.6f}\n")
        # Keep the rate even when a tick ran late.
        time.sleep(max(0.0, start + written * interval - time.monotonic()))
    for handle in handles:
        handle.close()
    print(json.dumps({"lines_per_file": written, "written_at": written_at}))


if __name__ == "__main__":
    main()
