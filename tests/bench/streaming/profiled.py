"""Runs a module under cProfile counting CPU time (not wall time: on a busy machine wall
time charges a process's waits for the CPU to whatever it was doing).

`python -m tests.bench.streaming.profiled OUT.prof -m daphne ARGS…`; stats are written
when the module returns (send SIGINT to stop Daphne)."""

from __future__ import annotations

import cProfile
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
    try:
        profile.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    finally:
        profile.dump_stats(output)


if __name__ == "__main__":
    main()
