"""Per-job supervisor of the local backend: `python -I local_supervisor.py RUN_DIR WORKDIR`.

It detaches from whoever started it (double fork, new session), so a Celery pool recycling
or a console restart never loses the job's exit code. It runs as the console's user and
keeps the job's control files in the run directory, which only that user can open; the
job's process gets only its working directory, runs as `--user` where one is given, and
never sees a file the console reads back as control data.

The command and the job's environment come as JSON on stdin, never in argv (where `ps`
shows them) or in the supervisor's own environment (a job's LD_PRELOAD must not load into
a process of the console's user). The command runs as argv (never through a shell) in its
own process group; its output comes through a pipe and the supervisor appends it to the
log, so the job can't rewrite earlier lines.

Under the run directory's lock it starts the command only if no other supervisor of this
run did, and only if the console has not asked the job to stop meanwhile (`intent`); the
console's cancel takes the same lock before it looks for the process to signal.

Files in the run directory: lock, intent (console), supervisor.pid, child.pid, exit_code
or not_started, output.log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
from pathlib import Path

PIPE_CHUNK = 1 << 16
STOP_INTENTS = {"pause": "paused", "cancel": "cancelled"}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _credentials(user: str | None) -> dict:
    """Popen arguments that drop the job to `user` (uid, its group, no other groups)."""
    if not user:
        return {}
    entry = pwd.getpwnam(user)
    if entry.pw_uid == os.geteuid():
        return {}
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _copy_output(read_fd: int, log, max_bytes: int) -> None:
    """Copy the job's output into the log until it holds one byte past the cap (readers
    then show it truncated); later output is drained and dropped, so the job never blocks
    on a full pipe. A resumed attempt appends: the cap counts what is there."""
    size = os.fstat(log.fileno()).st_size
    while True:
        try:
            data = os.read(read_fd, PIPE_CHUNK)
        except OSError:
            return
        if not data:
            return
        room = max_bytes + 1 - size
        if room > 0:
            kept = data[:room]
            log.write(kept)
            size += len(kept)


def supervise(run_dir: Path, workdir: str, user: str | None, spec: dict) -> None:
    """The detached supervisor's whole life; it ends with os._exit."""
    os.umask(0o077)
    lock = os.open(run_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    if any((run_dir / name).exists() for name in ("child.pid", "exit_code", "not_started")):
        os._exit(0)  # another supervisor of this run got here first: one run only
    log = open(run_dir / "output.log", "ab", buffering=0)  # noqa: SIM115
    intent = (run_dir / "intent").read_text().strip() if (run_dir / "intent").exists() else ""
    if intent in STOP_INTENTS:
        log.write(f"gpugeek: not started: the job was {STOP_INTENTS[intent]} first\n".encode())
        _write_atomic(run_dir / "not_started", intent)
        os._exit(0)
    _write_atomic(run_dir / "supervisor.pid", str(os.getpid()))
    read_fd, write_fd = os.pipe()
    try:
        child = subprocess.Popen(  # noqa: S603  (argv from a validated spec; no shell)
            spec["command"],
            cwd=workdir,
            env=spec["env"],
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,
            umask=0o077,
            **_credentials(user),
        )
    except (OSError, KeyError, subprocess.SubprocessError) as error:
        log.write(f"gpugeek: could not start {spec['command'][0]!r}: {error}\n".encode())
        _write_atomic(run_dir / "exit_code", "127")
        os._exit(0)
    os.close(write_fd)
    _write_atomic(run_dir / "child.pid", str(child.pid))
    fcntl.flock(lock, fcntl.LOCK_UN)

    def forward(signum, frame):  # a signal to the supervisor goes to the job too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    max_bytes = int(spec.get("log_max_bytes") or 2**40)
    copier = threading.Thread(target=_copy_output, args=(read_fd, log, max_bytes), daemon=True)
    copier.start()
    code = child.wait()
    # What the job left running in its group ends with it (as a pod's containers do);
    # that also closes the pipe's last writers.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    copier.join(timeout=5)
    # exit_code is written after the job's last output: readers rely on that order.
    _write_atomic(run_dir / "exit_code", str(code))
    os._exit(0)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--user"):
        print("usage: local_supervisor RUN_DIR WORKDIR [--user NAME] < spec.json", file=sys.stderr)
        return 2
    run_dir, workdir = Path(argv[0]), argv[1]
    user = argv[3] if len(argv) == 4 else None
    spec = json.loads(sys.stdin.buffer.read())
    # Detach: the first process exits at once (its starter reaps it, no zombie), the
    # second lives on, owned by init, in a session of its own.
    if os.fork() > 0:
        return 0
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    supervise(run_dir, workdir, user, spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
