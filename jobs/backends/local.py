"""The local backend: work runs as processes on this host; GPUs are found with NVML.

Each job runs under its own detached supervisor (jobs.backends.local_supervisor) that
records pid, exit code and output in the job's run directory, so jobs survive a console
restart and exit codes are never lost. This runs commands directly on the host, without a
container: it is meant for one trusted team and is not a security boundary.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from jobs.backends.base import (
    BackendRejected,
    LogLine,
    LogSource,
    NodeInventory,
    Observation,
)

log = logging.getLogger(__name__)
LOCAL_REGION = "local"


def _memory_gib() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // (1024 * 1024)
    except OSError:
        pass
    return 0


def nvml_devices() -> list[tuple[int, str]]:
    """(index, name) of this host's GPUs as NVML reports them; empty without a driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []  # no NVIDIA driver on this host: a CPU-only machine
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            devices.append((index, name.decode() if isinstance(name, bytes) else name))
        return devices
    finally:
        pynvml.nvmlShutdown()


def nvml_gpu_names() -> list[str]:
    return [name for _, name in nvml_devices()]


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The state follows the parenthesised command name; Z is a zombie.
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class LocalBackend:
    name = "local"

    def __init__(self, data_dir: Path | None = None):
        self.data_dir = Path(data_dir or settings.DATA_DIR)

    # --- inventory ------------------------------------------------------------------------
    def inventory(self) -> list[NodeInventory]:
        host = socket.gethostname()
        # Local CPU jobs are often light (scripts, tests): allow some overcommit.
        vcpus = (os.cpu_count() or 1) * settings.LOCAL_CPU_OVERCOMMIT
        memory = _memory_gib()
        nodes = [
            NodeInventory(
                name=f"{host}/cpu",
                region=LOCAL_REGION,
                tier="on_demand",
                vcpus_allocatable=vcpus,
                memory_gib=memory,
            )
        ]
        # One inventory entry per GPU model on the host (mixed hosts are possible).
        for product, count in Counter(nvml_gpu_names()).items():
            nodes.append(
                NodeInventory(
                    name=f"{host}/{product}",
                    region=LOCAL_REGION,
                    tier="on_demand",
                    gpu_resource="nvidia.com/gpu",
                    gpu_product=product,
                    gpus_allocatable=count,
                    vcpus_allocatable=vcpus,
                    memory_gib=memory,
                )
            )
        return nodes

    # --- files ------------------------------------------------------------------------------
    def run_dir(self, job) -> Path:
        path = self.data_dir / "jobs" / str(job.pk)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def log_path(self, job) -> Path:
        return self.run_dir(job) / "output.log"

    @contextmanager
    def _locked(self, job):
        with open(self.run_dir(job) / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _child_pid(self, job) -> int | None:
        return _read_int(self.run_dir(job) / "child.pid")

    # --- lifecycle ----------------------------------------------------------------------------
    def _environment(self, job, resumed: bool) -> dict[str, str]:
        from console.crypto import decrypt_json

        env = {
            key: value
            for key, value in os.environ.items()
            if key in ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
        }
        # The console's virtualenv first, so `python` is its interpreter.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin')}"
        env.update({str(k): str(v) for k, v in (job.env or {}).items()})
        env.update({str(k): str(v) for k, v in decrypt_json(job.secret_env_encrypted).items()})
        workdir = self.run_dir(job) / "work"
        env.update(
            {
                "GPUGEEK_JOB_ID": str(job.pk),
                "GPUGEEK_ATTEMPT": str(job.attempt),
                "GPUGEEK_RESUMED": "1" if resumed else "0",
                "GPUGEEK_CHECKPOINT_PATH": job.checkpoint_path or str(workdir / "checkpoint"),
                "WORLD_SIZE": "1",
                "NODE_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",
                "PYTHONUNBUFFERED": "1",
                "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in job.assigned_devices) or "",
            }
        )
        return env

    def assign_devices(self, job, busy: set[int]) -> list[int]:
        """Pick free GPU indices of the job's type (exclusive per job)."""
        if not job.gpus_per_node:
            return []
        names = {n.lower() for n in job.gpu_type.nvml_names}
        matching = [
            index
            for index, name in nvml_devices()
            if name.lower().removeprefix("nvidia ").strip() in names and index not in busy
        ]
        if len(matching) < job.gpus_per_node:
            raise BackendRejected(
                f"only {len(matching)} free {job.gpu_type.slug} GPU(s) on this "
                f"host, {job.gpus_per_node} asked"
            )
        return matching[: job.gpus_per_node]

    def _start(self, job, resumed: bool) -> None:
        run_dir = self.run_dir(job)
        with self._locked(job):
            child = self._child_pid(job)
            if _alive(child) and not (run_dir / "exit_code").exists():
                return  # already running: submit twice is one run
            for name in ("exit_code", "child.pid", "supervisor.pid", "intent", "term_sent"):
                (run_dir / name).unlink(missing_ok=True)
            workdir = run_dir / "work"
            workdir.mkdir(exist_ok=True)
            user = settings.LOCAL_JOB_USER or None
            starter = subprocess.Popen(  # noqa: S603  (argv only, no shell)
                [
                    sys.executable,
                    "-m",
                    "jobs.backends.local_supervisor",
                    str(run_dir),
                    str(workdir),
                    "--",
                    *job.command,
                ],
                cwd=settings.BASE_DIR,
                env={**self._environment(job, resumed), "PYTHONPATH": str(settings.BASE_DIR)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                user=user,
            )
            starter.wait(timeout=30)  # exits at once after detaching the supervisor
            # The supervisor writes child.pid (or exit_code 127) right after starting.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if (run_dir / "child.pid").exists() or (run_dir / "exit_code").exists():
                    return
                time.sleep(0.02)
            raise BackendRejected("the local job supervisor did not start")

    def submit(self, job) -> None:
        self._start(job, resumed=False)

    def resume(self, job) -> None:
        self._start(job, resumed=True)

    def _signal(self, job, intent: str) -> None:
        run_dir = self.run_dir(job)
        (run_dir / "intent").write_text(intent)
        child = self._child_pid(job)
        if not _alive(child):
            return
        for signum in (signal.SIGTERM, signal.SIGCONT):  # a stopped process needs SIGCONT
            try:
                os.killpg(child, signum)
            except ProcessLookupError:
                return
        if not (run_dir / "term_sent").exists():
            (run_dir / "term_sent").write_text(str(time.time()))

    def suspend(self, job) -> None:
        self._signal(job, "pause")

    def cancel(self, job) -> None:
        self._signal(job, "cancel")

    def enforce_grace(self, job, grace_seconds: int) -> bool:
        """SIGKILL the job's process group once its grace period after SIGTERM is over."""
        run_dir = self.run_dir(job)
        try:
            sent = float((run_dir / "term_sent").read_text())
        except (OSError, ValueError):
            return False
        child = self._child_pid(job)
        if time.time() - sent < grace_seconds or not _alive(child):
            return False
        try:
            os.killpg(child, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def observe(self, job) -> Observation:
        run_dir = self.run_dir(job)
        code = _read_int(run_dir / "exit_code")
        intent = (run_dir / "intent").read_text().strip() if (run_dir / "intent").exists() else ""
        if code is not None:
            if intent == "pause":
                return Observation(phase="suspended", exit_code=code)
            if intent == "cancel":
                return Observation(phase="cancelled", exit_code=code)
            if code == 0:
                return Observation(phase="succeeded", exit_code=0)
            if code < 0:
                reason = f"killed by {signal.Signals(-code).name}"
            elif code == 127:
                reason = "command not found (exit code 127)"
            else:
                reason = f"exit code {code}"
            return Observation(phase="failed", reason=reason, exit_code=code)
        if _alive(self._child_pid(job)):
            return Observation(phase="running")
        if _alive(_read_int(run_dir / "supervisor.pid")):
            return Observation(phase="pending")
        return Observation(
            phase="missing",
            reason="the job's process is gone and left no exit "
            "code (host restarted or process killed)",
        )

    def log_sources(self, job) -> list[LogSource]:
        """One log per job: its output file (every line is rank 0)."""
        run_dir = self.data_dir / "jobs" / str(job.pk)  # no run_dir(): reading makes nothing
        return [LogSource(rank=0, key="output.log", live=not (run_dir / "exit_code").exists())]

    def open_log(
        self,
        job,
        source: LogSource,
        *,
        skip: int = 0,
        follow: bool = True,
        wake: Callable[[], None] | None = None,
    ) -> LocalLogStream:
        # No reading thread: each poll reads what was written since the last one, so a
        # follower of many jobs polls them from its event loop (`wake` is never called).
        run_dir = self.data_dir / "jobs" / str(job.pk)
        return LocalLogStream(run_dir, source, skip=skip, follow=follow)

    def logs(self, job, since_line: int = 0, limit: int = 1000) -> list[LogLine]:
        path = self.log_path(job)
        if not path.exists():
            return []
        lines = []
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if number <= since_line:
                    continue
                lines.append(
                    LogLine(line_no=number, rank=0, text=raw.decode(errors="replace").rstrip("\n"))
                )
                if len(lines) >= limit:
                    break
        return lines


class LocalLogStream:
    """A local job's output file after its first `skip` lines (`jobs.backends.base.LogStream`).

    Each poll reads the bytes written since the last one on an open handle and returns
    the complete lines; a last line without its newline counts once the job has ended
    (the supervisor wrote `exit_code`), as in the console's numbering of the file. A
    followed stream never ends by itself: a resumed job writes to the same file."""

    CHUNK = 4 << 20

    def __init__(self, run_dir: Path, source: LogSource, *, skip: int = 0, follow: bool = True):
        self.path = run_dir / source.key
        self.exit_path = run_dir / "exit_code"
        self.source = source
        self.skip = skip
        self.follow = follow
        self.handle = None
        self.partial = b""
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    def _open(self) -> bool:
        try:
            self.handle = open(self.path, "rb")  # noqa: SIM115 (kept open while followed)
        except FileNotFoundError:
            return False
        # Move past the first `skip` complete lines. With fewer so far, stop after the
        # last complete one and skip the rest from the lines still to come.
        skipped = start = position = 0
        while skipped < self.skip:
            data = self.handle.read(1 << 20)
            if not data:
                break
            newlines = data.count(b"\n")
            if skipped + newlines < self.skip:
                skipped += newlines
                if newlines:
                    start = position + data.rfind(b"\n") + 1
            else:
                at = -1
                for _ in range(self.skip - skipped):
                    at = data.index(b"\n", at + 1)
                start = position + at + 1
                skipped = self.skip
            position += len(data)
        self.handle.seek(start)
        self.skip -= skipped
        return True

    def poll(self) -> list[str]:
        if self._ended:
            return []
        if self.handle is None and not self._open():
            self._ended = not self.follow
            return []
        raws = self._read()
        if not raws or not self.follow:
            # Nothing new (or a snapshot): once the job has ended, a partial line is final.
            # `exit_code` is written after the job's last output, so checking it first and
            # then reading again misses nothing.
            if self.exit_path.exists():
                raws += self._read()
                if self.partial:
                    raws.append(self.partial)
                    self.partial = b""
            self._ended = not self.follow
        if self.skip:
            dropped = min(self.skip, len(raws))
            self.skip -= dropped
            raws = raws[dropped:]
        return [raw.decode(errors="replace").rstrip("\r") for raw in raws]

    def _read(self) -> list[bytes]:
        raws: list[bytes] = []
        while True:
            data = self.handle.read(self.CHUNK)
            if not data:
                return raws
            complete, newline, self.partial = (self.partial + data).rpartition(b"\n")
            if newline:
                raws.extend(complete.split(b"\n"))
            if len(data) < self.CHUNK:
                return raws

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        self._ended = True
