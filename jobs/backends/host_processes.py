"""Long-running processes on the console's host (a service's replicas), in the host jobs'
sandbox, under the host jobs' supervisor.

This is the small interface other rooms use instead of the local backend's job methods: a
process is named by a `key` (its run and work directories), started once with its command,
environment and the port it listens on, observed, stopped and discarded. The sandbox plan
(`local_sandbox.process_plan`) and the detached supervisor (`local_supervisor`) are the
jobs' own; what differs is the way in: a replica's network namespace is its own, so its
port is forwarded from a free port on the host's loopback (slirp4netns' `add_hostfwd`).
Without the sandbox (a single trusted organisation) the process listens on that loopback
port itself, and mounts no volume.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from django.conf import settings

from console.launcher import free_loopback_port
from jobs.backends import local_sandbox, local_supervisor, local_volumes
from jobs.backends.base import BackendRejected
from jobs.extensions import VolumeMount

SUPERVISOR = local_supervisor.__file__
# What the supervisor writes once it has dealt with a start.
STARTED_FILES = ("child.pid", "exit_code", "not_started")


class HostProcessError(Exception):
    """The process could not be started (the message says why, for the user)."""


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The state follows the parenthesised command name; Z is a zombie.
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def supervisor_launch(*, run_dir: Path, workdir: Path, spec: dict, user: str | None) -> None:
    """Start a detached supervisor for `spec` (JSON on its stdin, never argv) and wait until
    it has dealt with the start (child.pid, exit_code or not_started)."""
    starter = subprocess.Popen(  # noqa: S603  (argv only, no shell)
        [
            sys.executable,
            "-I",  # no PYTHONPATH, user site or current directory on its path
            SUPERVISOR,
            str(run_dir),
            str(workdir),
            *(["--user", user] if user else []),
        ],
        cwd=run_dir,
        env={key: os.environ[key] for key in ("PATH", "LANG") if key in os.environ},
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # The starter reads the spec, detaches the supervisor and exits at once.
    starter.communicate(json.dumps(spec).encode(), timeout=30)


def wait_started(run_dir: Path, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any((run_dir / name).exists() for name in STARTED_FILES):
            return True
        time.sleep(0.02)
    return False


@dataclass(frozen=True)
class HostProcess:
    """What to run. `key` names it for good (e.g. "service-3-replica-12"); `slot` picks its
    own host uid (from the range after the jobs' one); `port` is where it listens."""

    key: str
    tenant_id: int
    slot: int
    command: list[str]
    env: dict[str, str]
    port: int
    cpus: int
    # The organisation's volumes it sees (read-only, for a replica: model weights).
    volumes: tuple[VolumeMount, ...] = ()


def _run_root() -> Path:
    return Path(settings.DATA_DIR) / "host-processes"


def run_dir(key: str) -> Path:
    return _run_root() / key


def workdir(key: str) -> Path:
    return local_sandbox.work_root() / f"hp-{key}"


def _uid(slot: int) -> int:
    return (
        settings.LOCAL_JOB_UID_BASE
        + settings.LOCAL_JOB_ID_COUNT
        + slot % (settings.LOCAL_JOB_ID_COUNT)
    )


def _limits(cpus: int) -> local_sandbox.JobLimits:
    share = min(1.0, cpus / max(1, os.cpu_count() or 1))
    return local_sandbox.JobLimits(
        memory_bytes=max(int(psutil.virtual_memory().total * share * 0.9), 256 << 20),
        processes=settings.LOCAL_JOB_MAX_PROCESSES,
        disk_bytes=int(settings.LOCAL_JOB_DISK_GIB * (1 << 30)),
    )


def _make_workdir(path: Path, owner: tuple[int, int] | None) -> None:
    root = path.parent
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # noqa: S103  (each process passes through to its own dir only)
    path.mkdir(mode=0o700, exist_ok=True)
    (path / "tmp").mkdir(mode=0o700, exist_ok=True)
    if owner and owner[0] != os.geteuid():
        for each in (path, path / "tmp"):
            os.chown(each, owner[0], owner[1], follow_symlinks=False)


def host_process_start(process: HostProcess) -> int:
    """Start the process (once per key: a key that ran before is emptied first) and return
    the loopback port it is reached on. Raises HostProcessError when it can't start."""
    support = local_sandbox.sandbox_support()
    if support.available and not support.network:
        raise HostProcessError(
            "services on this host need the sandbox's network (run the console as root "
            "with slirp4netns installed)."
        )
    try:
        binds = local_volumes.mount_binds(tenant_id=process.tenant_id, mounts=list(process.volumes))
    except BackendRejected as error:
        raise HostProcessError(str(error)) from None
    directory = run_dir(process.key)
    host_discard(process.key)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    work = workdir(process.key)
    host_port = free_loopback_port()
    env = {key: os.environ[key] for key in ("LANG", "LC_ALL", "TZ") if key in os.environ}
    user = None
    owner: tuple[int, int] | None = None
    if support.available:
        uid = _uid(process.slot) if support.own_uid else None
        gid = local_sandbox.tenant_gid(process.tenant_id) if support.own_uid else None
        owner = (uid, gid) if uid is not None and gid is not None else None
        env.update(
            PATH=local_sandbox.SANDBOX_PATH,
            HOME=local_sandbox.WORKSPACE,
            TMPDIR=local_sandbox.SANDBOX_TMP,
            USER=local_sandbox.INNER_USER,
        )
    else:
        user = settings.LOCAL_JOB_USER or None
        if user:
            entry = pwd.getpwnam(user)
            owner = (entry.pw_uid, entry.pw_gid)
        system_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{system_path}",
            HOME=str(work),
            TMPDIR=str(work / "tmp"),
        )
    _make_workdir(work, owner)
    env.update({str(k): str(v) for k, v in process.env.items()})
    # Inside its sandbox it listens on its own port (as on Kubernetes); without one, on
    # the loopback port itself.
    listen_port = process.port if support.available else host_port
    env.update(PORT=str(listen_port), PYTHONUNBUFFERED="1")
    spec: dict = {
        "command": list(process.command),
        "env": env,
        "log_max_bytes": settings.JOB_LOG_MAX_BYTES,
    }
    if support.available:
        plan = local_sandbox.process_plan(
            hostname=f"gpugeek-{process.key}"[:63],
            devices=[],
            uid=owner[0] if owner else None,
            gid=owner[1] if owner else None,
            workdir=work,
            env=env,
            limits=_limits(process.cpus),
            binds=local_sandbox.volume_bind_args(binds),
        )
        plan["network"]["publish"] = {
            "api_socket": str(directory / "slirp.sock"),
            "host_port": host_port,
            "guest_port": process.port,
        }
        spec["env"] = {}  # the sandbox sets the environment itself
        spec["sandbox"] = plan
    supervisor_launch(run_dir=directory, workdir=work, spec=spec, user=user)
    if not wait_started(directory):
        raise HostProcessError("its supervisor did not start")
    if (directory / "exit_code").exists():
        raise HostProcessError(host_exit_reason(process.key) or "it could not start")
    return host_port


def host_running(key: str) -> bool:
    directory = run_dir(key)
    if (directory / "exit_code").exists() or (directory / "not_started").exists():
        return False
    return pid_alive(read_int(directory / "child.pid")) or pid_alive(
        read_int(directory / "supervisor.pid")
    )


def host_output_tail(key: str, max_bytes: int) -> bytes:
    """The last `max_bytes` of what the process printed (b"" if nothing, or gone)."""
    path = run_dir(key) / "output.log"
    try:
        with path.open("rb") as output:
            output.seek(max(0, path.stat().st_size - max_bytes))
            return output.read(max_bytes)
    except OSError:
        return b""


def host_exit_reason(key: str) -> str:
    """Why it ended (its exit code and the last line it printed), or "" while it runs."""
    directory = run_dir(key)
    code = read_int(directory / "exit_code")
    if code is None:
        return ""
    last = ""
    with contextlib.suppress(OSError):
        lines = (directory / "output.log").read_bytes()[-2000:].decode(errors="replace")
        last = next((line for line in reversed(lines.splitlines()) if line.strip()), "")
    return f"exit code {code}" + (f": {last.strip()[:200]}" if last else "")


def host_stop(key: str, grace_seconds: float = 5) -> None:
    """Stop it: SIGTERM (the supervisor passes it on), then SIGKILL after the grace."""
    directory = run_dir(key)
    if not directory.exists():
        return
    with open(directory / "lock", "a") as lock:
        # Under the lock: a supervisor about to start the command sees the intent first.
        fcntl.flock(lock, fcntl.LOCK_EX)
        (directory / "intent").write_text("cancel")
    supervisor = read_int(directory / "supervisor.pid")
    if pid_alive(supervisor):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(supervisor, signal.SIGTERM)  # type: ignore[arg-type]
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and host_running(key):
        time.sleep(0.05)
    if host_running(key):
        for name in ("sandbox.pid", "child.pid"):
            pid = read_int(directory / name)
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # type: ignore[arg-type]
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]


def host_discard(key: str) -> None:
    """Remove what a stopped process left (its run and work directories)."""
    if host_running(key):
        host_stop(key)
    shutil.rmtree(run_dir(key), ignore_errors=True)
    shutil.rmtree(workdir(key), ignore_errors=True)
