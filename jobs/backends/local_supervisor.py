"""Per-job supervisor of the local backend: `python -m jobs.backends.local_supervisor`.

It detaches from whoever started it (double fork, new session), so a Celery pool recycling
or a console restart never loses the job's exit code. It runs the command as argv (never
through a shell) in its own process group, appends its output to the job's log, and writes
the exit code atomically when the command ends.

Files in the run directory: supervisor.pid, child.pid, exit_code, output.log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    run_dir, workdir, separator, *command = argv
    if separator != "--" or not command:
        print("usage: local_supervisor RUN_DIR WORKDIR -- COMMAND...", file=sys.stderr)
        return 2
    run_dir_path = Path(run_dir)
    # Detach: the first process exits at once (its starter reaps it, no zombie), the
    # second lives on, owned by init, in a session of its own.
    if os.fork() > 0:
        return 0
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    _write_atomic(run_dir_path / "supervisor.pid", str(os.getpid()))
    log = open(run_dir_path / "output.log", "ab", buffering=0)  # noqa: SIM115
    try:
        child = subprocess.Popen(  # noqa: S603  (argv from a validated spec; no shell)
            command,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as error:
        log.write(f"gpugeek: could not start {command[0]!r}: {error}\n".encode())
        _write_atomic(run_dir_path / "exit_code", "127")
        os._exit(0)
    _write_atomic(run_dir_path / "child.pid", str(child.pid))

    def forward(signum, frame):  # a signal to the supervisor goes to the job too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    _write_atomic(run_dir_path / "exit_code", str(code))
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
