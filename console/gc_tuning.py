"""Garbage-collector settings for the long-running processes (web and worker).

CPython's full collections walk every tracked object. The web process holds thousands of
long-lived sockets, and a metering tick allocates tens of thousands of short-lived rows:
with the default thresholds the collector ran many times per tick and paused delivery of
live log lines (tests/bench/streaming) and the tick (tests/bench/metering) for a tenth of
a second or more. Freezing what start-up allocated (never garbage) and collecting young
objects less eagerly removes that without letting real garbage pile up.
"""

from __future__ import annotations

import gc


def tune_garbage_collector() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
