"""Runs a module under cProfile counting CPU time (not wall time: on a busy machine wall
time charges a process's waits for the CPU to whatever it was doing).

`python -m tests.bench.streaming.profiled OUT.prof -m uvicorn ARGS…`; stats are written
when the module returns (send SIGINT to stop uvicorn). Profiling is off until SIGUSR2
(or from the start with GPUGEEK_PROFILE_FROM_START=1)."""

from __future__ import annotations

import cProfile
import os
import runpy
import sys
import time


def main() -> None:
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: stacks to stderr
    output, flag, module, *arguments = sys.argv[1:]
    assert flag == "-m", "usage: profiled OUT.prof -m MODULE ARGS…"
    sys.argv = [module, *arguments]
    profile = cProfile.Profile(time.process_time)
    # `kill -USR2` starts and stops profiling, so the stats can cover one phase (the
    # benchmark profiles the writing phase, not the 1,000 connects before it).
    profiling = {"on": os.environ.get("GPUGEEK_PROFILE_FROM_START") == "1"}

    def toggle(signum, frame) -> None:
        if profiling["on"]:
            profile.disable()
        else:
            profile.enable()
        profiling["on"] = not profiling["on"]

    signal.signal(signal.SIGUSR2, toggle)
    if profiling["on"]:
        profile.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profile.disable()
        profile.dump_stats(output)


if __name__ == "__main__":
    main()
