"""The local backend: work runs as processes on this host; GPUs are found with NVML.

Each job runs under its own detached supervisor (jobs.backends.local_supervisor) that
records pid, exit code and output in the job's run directory, so jobs survive a console
restart and exit codes are never lost. Running on the host is a privilege staff grant per
tenant. Where bubblewrap works (`local_sandbox.sandbox_support`) each job runs in its own
sandbox as its own unprivileged uid and sees nothing of the console or of other jobs;
elsewhere it runs with an environment built from scratch as LOCAL_JOB_USER (when set), and
host access is limited to one organisation. Either way nothing it can write is read back
as control data: the run directory is the supervisor's, out of the job's reach.
"""

from __future__ import annotations

import fcntl
import logging
import os
import platform
import pwd
import shutil
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from console.crypto import decrypt_json
from jobs import gpu_readings
from jobs.backends import host_processes, local_sandbox, local_supervisor, local_volumes
from jobs.backends.base import (
    BackendRejected,
    BackendUnavailable,
    ComputeBackend,
    GpuReading,
    LogFile,
    LogLine,
    LogSource,
    NodeInventory,
    Observation,
    TenantIsolation,
)
from jobs.backends.host_processes import pid_alive, read_int
from jobs.backends.local_checkpoints import checkpoint_environment, checkpoint_folder
from jobs.backends.local_files import LocalFiles
from jobs.backends.local_logs import LocalLogStream, run_ended
from jobs.backends.local_ports import LocalPorts, publish_job_ports
from jobs.logs.stores import FileLog
from marketplace.inventory import ARCH_LABEL

if TYPE_CHECKING:
    from jobs.models import Job

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


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


SUPERVISOR = local_supervisor.__file__
# What the supervisor writes once it has dealt with a start: the command runs (or ran), or
# could not start, or was not started because the job was stopped first.
_STARTED = ("child.pid", "exit_code", "not_started")
# How long a start may take before a run with no supervisor is called lost: well past
# the dispatcher's own 10 s wait for the supervisor.
START_GRACE_SECONDS = 30


NOTE_NO_NVML = "no GPU readings: NVML is not available on this host"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"


def exit_reason(code: int) -> str:
    """Why a job with this exit code failed. In the sandbox a signal's death is reported
    as 128 + its number (as shells and Kubernetes do); without one, as -number."""
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if code == 127:
        return "command not found (exit code 127)"
    if 128 < code < 128 + 65:
        return f"exit code {code} (killed by {_signal_name(code - 128)}?)"
    return f"exit code {code}"


def _host_arch() -> str:
    """This host's CPU architecture in Kubernetes' terms (kubernetes.io/arch)."""
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


class LocalBackend(LocalPorts, LocalFiles, ComputeBackend):
    """Jobs as supervised processes on this host, on the GPU devices the console assigns."""

    name = "local"
    starts_immediately = True
    assigns_devices = True
    enforces_grace = True
    runs_on_console_host = True

    def __init__(self, data_dir: Path | None = None):
        self.data_dir = Path(data_dir or settings.DATA_DIR)

    # --- inventory ------------------------------------------------------------------------
    def inventory(self) -> list[NodeInventory]:
        host = socket.gethostname()
        # Local CPU jobs are often light (scripts, tests): allow some overcommit.
        vcpus = (os.cpu_count() or 1) * settings.LOCAL_CPU_OVERCOMMIT
        memory = _memory_gib()
        labels = {ARCH_LABEL: _host_arch()}
        nodes = [
            NodeInventory(
                name=f"{host}/cpu",
                region=LOCAL_REGION,
                tier="on_demand",
                labels=labels,
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
                    labels=labels,
                    gpu_resource="nvidia.com/gpu",
                    gpu_product=product,
                    gpus_allocatable=count,
                    vcpus_allocatable=vcpus,
                    memory_gib=memory,
                )
            )
        return nodes

    # --- files ------------------------------------------------------------------------------
    # The run directory (console only, 0700) holds what the console reads back: pid and
    # exit files written by the supervisor, the intent and lock written by the console,
    # and the output log. The job's working directory (its cwd, HOME and TMPDIR) is
    # elsewhere; nothing in it is ever read as control data.
    CONTROL_FILES = (
        "run",
        "exit_code",
        "not_started",
        "child.pid",
        "supervisor.pid",
        "sandbox.pid",
        "limit",
        "intent",
        "term_sent",
    )

    def run_dir(self, job) -> Path:
        path = self.data_dir / "jobs" / str(job.pk)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def work_root(self) -> Path:
        return local_sandbox.work_root()

    def workdir(self, job) -> Path:
        return self.work_root() / str(job.pk)

    def log_path(self, job) -> Path:
        return self.run_dir(job) / "output.log"

    @staticmethod
    def _identity(job) -> str:
        """Which job a run directory belongs to: ids alone repeat across databases."""
        return f"{job.pk} {job.created_at.timestamp():.6f}"

    @contextmanager
    def _locked(self, job):
        """The run directory's lock (the supervisor takes it too), claimed for this job:
        a directory left by another job of the same id (another database) is emptied."""
        run_dir = self.run_dir(job)
        with open(run_dir / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            identity = self._identity(job)
            owner = run_dir / "job"
            if not owner.exists() or owner.read_text() != identity:
                for path in run_dir.iterdir():
                    if path.name != "lock":
                        path.unlink()
                shutil.rmtree(self.workdir(job), ignore_errors=True)
                owner.write_text(identity)
            yield run_dir

    def _child_pid(self, job) -> int | None:
        return read_int(self.run_dir(job) / "child.pid")

    def _make_workdir(self, job, owner: tuple[int, int] | None) -> Path:
        """The job's own directory, owned by the uid/gid it runs as; only it may list it."""
        root = self.work_root()
        root.mkdir(parents=True, exist_ok=True)
        # Each job may pass through to its own directory, not list the others.
        os.chmod(root, 0o711)  # noqa: S103
        workdir = self.workdir(job)
        if workdir.is_dir():
            return workdir
        workdir.mkdir(mode=0o700)
        (workdir / "tmp").mkdir(mode=0o700)
        if owner and owner[0] != os.geteuid():
            for path in (workdir, workdir / "tmp"):
                os.chown(path, owner[0], owner[1], follow_symlinks=False)
        return workdir

    @staticmethod
    def _owner(job) -> tuple[int, int] | None:
        """The host uid/gid the job runs as: its own in the sandbox (console as root),
        LOCAL_JOB_USER's without one, else the console's (None)."""
        support = local_sandbox.sandbox_support()
        if support.available:
            if support.own_uid:
                return local_sandbox.job_uid(job), local_sandbox.tenant_gid(job.tenant_id)
            return None
        if settings.LOCAL_JOB_USER:
            entry = pwd.getpwnam(settings.LOCAL_JOB_USER)
            return entry.pw_uid, entry.pw_gid
        return None

    # --- lifecycle ----------------------------------------------------------------------------
    def _environment(self, job, resumed: bool) -> dict[str, str]:
        """The job's environment, built from scratch: nothing of the console's (its
        database, Redis, secret key, settings module, PYTHONPATH) reaches the job."""
        env = {key: os.environ[key] for key in ("LANG", "LC_ALL", "TZ") if key in os.environ}
        if local_sandbox.sandbox_support().available:
            home = local_sandbox.WORKSPACE
            env.update(
                {
                    "PATH": local_sandbox.SANDBOX_PATH,
                    "HOME": home,
                    "TMPDIR": local_sandbox.SANDBOX_TMP,
                    "USER": local_sandbox.INNER_USER,
                    "LOGNAME": local_sandbox.INNER_USER,
                }
            )
        else:
            workdir = self.workdir(job)
            home = str(workdir)
            # The console's virtualenv first, so `python` is its interpreter (its libraries,
            # not the console's code: that is never on the job's path).
            system_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{system_path}"
            env.update({"HOME": home, "TMPDIR": str(workdir / "tmp")})
        env.update({str(k): str(v) for k, v in (job.env or {}).items()})
        env.update({str(k): str(v) for k, v in decrypt_json(job.secret_env_encrypted).items()})
        env.update(
            {
                "GPUGEEK_JOB_ID": str(job.pk),
                "GPUGEEK_ATTEMPT": str(job.attempt),
                "GPUGEEK_RESUMED": "1" if resumed else "0",
                "GPUGEEK_CHECKPOINT_PATH": job.checkpoint_path or f"{home}/checkpoint",
                "WORLD_SIZE": "1",
                "NODE_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500",
                "PYTHONUNBUFFERED": "1",
                "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in job.assigned_devices) or "",
                **checkpoint_environment(job, sandboxed=local_sandbox.sandbox_support().available),
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

    def _run_token(self, job, resumed: bool) -> str:
        """Names one start of the job: the same for a duplicate or redelivered dispatch
        (which must not run the command again), new for each attempt and each resume."""
        if not resumed:
            return f"attempt {job.attempt} start"
        resumes = job.events.filter(to_status="resuming").count()
        return f"attempt {job.attempt} resume {resumes}"

    def _start(self, job, resumed: bool) -> None:
        token = self._run_token(job, resumed)
        support = local_sandbox.sandbox_support()
        user = None if support.available else (settings.LOCAL_JOB_USER or None)
        with self._locked(job) as run_dir:
            if _read_text(run_dir / "run") == token:
                if any((run_dir / name).exists() for name in _STARTED) or pid_alive(
                    read_int(run_dir / "supervisor.pid")
                ):
                    return  # this start happened already (running or even ended): once only
                # Else its supervisor never came up: start one (supervisors of one run
                # agree under the lock on which of them runs the command).
            else:
                if _read_text(run_dir / "intent") == "cancel":
                    return  # cancelled: a job the console cancelled never starts again
                if pid_alive(self._child_pid(job)) and not (run_dir / "exit_code").exists():
                    raise BackendUnavailable("the job's previous process is still stopping")
                for name in self.CONTROL_FILES:
                    (run_dir / name).unlink(missing_ok=True)
                (run_dir / "run").write_text(token)
            workdir = self._make_workdir(job, self._owner(job))
            checkpoints = checkpoint_folder(job, self._owner(job))
            volumes = local_volumes.volume_binds(job)
            # A later attempt (requeued after preemption) continues the job's work.
            env = self._environment(job, resumed or job.attempt > 1 or bool(job.resume_from))
            spec: dict = {
                "command": list(job.command),
                "env": env,
                # The supervisor has no settings: it stops storing output at the cap.
                "log_max_bytes": settings.JOB_LOG_MAX_BYTES,
            }
            if support.available:
                spec["env"] = {}  # the sandbox sets the job's environment itself
                spec["sandbox"] = local_sandbox.sandbox_plan(
                    job=job,
                    workdir=workdir,
                    env=env,
                    limits=self.limits(job),
                    checkpoints=checkpoints,
                    volumes=volumes,
                    published=self.published_dir(job),
                )
                publish_job_ports(spec["sandbox"], job=job, run_dir=run_dir)
            host_processes.supervisor_launch(run_dir=run_dir, workdir=workdir, spec=spec, user=user)
        # The supervisor takes the lock, then writes child.pid (or exit_code 127, or
        # not_started when the job was stopped first).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any((run_dir / name).exists() for name in _STARTED):
                return
            time.sleep(0.02)
        raise BackendRejected("the local job supervisor did not start")

    def submit(self, job) -> None:
        self._start(job, resumed=False)

    def resume(self, job) -> None:
        self._start(job, resumed=True)

    def _signal(self, job, intent: str) -> None:
        # Under the lock: a supervisor about to start the command either sees the intent
        # (and doesn't start it) or has written child.pid, which is signalled here.
        with self._locked(job) as run_dir:
            if _read_text(run_dir / "intent") == "cancel":
                intent = "cancel"  # a cancel is final: a later pause doesn't undo it
            (run_dir / "intent").write_text(intent)
            child = self._child_pid(job)
            if not pid_alive(child) or (run_dir / "exit_code").exists():
                return
            if (run_dir / "sandbox.pid").exists():
                # The supervisor sends it to every process in the job's sandbox.
                targets = [(read_int(run_dir / "supervisor.pid"), os.kill, (signal.SIGTERM,))]
            else:  # a stopped process needs SIGCONT to act on SIGTERM
                targets = [(child, os.killpg, (signal.SIGTERM, signal.SIGCONT))]
            for pid, send, signums in targets:
                for signum in signums:
                    try:
                        send(pid, signum)
                    except ProcessLookupError:
                        return
            if not (run_dir / "term_sent").exists():
                (run_dir / "term_sent").write_text(str(time.time()))

    def suspend(self, job) -> None:
        self._signal(job, "pause")

    def cancel(self, job) -> None:
        self._signal(job, "cancel")

    def enforce_grace(self, job, grace_seconds: int) -> bool:
        """Kill the job once its grace period after SIGTERM is over: its sandbox's PID 1
        (the kernel ends every process in it), or its process group without a sandbox."""
        run_dir = self.run_dir(job)
        try:
            sent = float((run_dir / "term_sent").read_text())
        except (OSError, ValueError):
            return False
        child = self._child_pid(job)
        if time.time() - sent < grace_seconds or not pid_alive(child):
            return False
        if (run_dir / "exit_code").exists():
            return False  # ended (and reaped): its pid may belong to another process now
        sandbox_init = read_int(run_dir / "sandbox.pid")
        try:
            if sandbox_init:
                os.kill(sandbox_init, signal.SIGKILL)
            else:
                os.killpg(child, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def observe(self, job) -> Observation:
        observation = self._observe_once(job)
        if observation.phase == "missing":
            # The supervisor writes exit_code and exits between our reads of the files and
            # of its pid: read once more before calling a job that just ended lost.
            observation = self._observe_once(job)
        return observation

    def _observe_once(self, job) -> Observation:
        run_dir = self.run_dir(job)
        code = read_int(run_dir / "exit_code")
        intent = _read_text(run_dir / "intent")
        if (run_dir / "not_started").exists():
            # Stopped before its command started (the supervisor saw the intent first).
            return Observation(phase="suspended" if intent == "pause" else "cancelled")
        if code is not None:
            if intent == "pause":
                return Observation(phase="suspended", exit_code=code)
            if intent == "cancel":
                return Observation(phase="cancelled", exit_code=code)
            limit = _read_text(run_dir / "limit")
            if limit:
                return Observation(phase="failed", reason=limit, exit_code=code)
            if code == 0:
                return Observation(phase="succeeded", exit_code=0)
            return Observation(phase="failed", reason=exit_reason(code), exit_code=code)
        if pid_alive(self._child_pid(job)):
            return Observation(phase="running")
        if pid_alive(read_int(run_dir / "supervisor.pid")):
            return Observation(phase="pending")
        if self._starting(run_dir):
            return Observation(phase="pending")
        return Observation(
            phase="missing",
            reason="the job's process is gone and left no exit "
            "code (host restarted or process killed)",
        )

    @staticmethod
    def _starting(run_dir: Path) -> bool:
        """A start is under way: its run token is written but its supervisor hasn't yet
        written its pid (the dispatcher still holds the lock, or the supervisor's
        interpreter is starting). Seen as lost, a resume on a busy host failed its job."""
        try:
            written = (run_dir / "run").stat().st_mtime
        except OSError:
            return False
        if any((run_dir / name).exists() for name in _STARTED):
            return False
        return time.time() - written < START_GRACE_SECONDS

    def log_sources(self, job) -> list[LogSource]:
        """One log per job: its output file (every line is rank 0)."""
        run_dir = self.data_dir / "jobs" / str(job.pk)  # no run_dir(): reading makes nothing
        return [LogSource(rank=0, key="output.log", live=not run_ended(run_dir))]

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

    def log_file(self, job: Job) -> LogFile:
        """The output file, numbered as written; complete once the exit code is recorded."""
        run_dir = self.data_dir / "jobs" / str(job.pk)  # no run_dir(): reading makes nothing
        return LogFile(path=run_dir / "output.log", complete=run_ended(run_dir))

    # --- metrics ------------------------------------------------------------------------------
    def gpu_readings(self, jobs: list[Job]) -> dict[int, list[GpuReading]]:
        """NVML readings of each job's assigned devices (none without NVML)."""
        by_job = {}
        for job in jobs:
            if not (job.gpus_per_node and job.assigned_devices):
                continue
            readings = gpu_readings.nvml_readings([int(i) for i in job.assigned_devices])
            if readings:
                by_job[job.pk] = readings
        return by_job

    def metrics_note(self, job: Job) -> str:
        return "" if gpu_readings.nvml_readings([]) is not None else NOTE_NO_NVML

    # --- isolation and disk ---------------------------------------------------------------
    def limits(self, job: Job) -> local_sandbox.JobLimits:
        return local_sandbox.job_limits(job, job.pool)

    def tenant_isolation(self) -> TenantIsolation:
        support = local_sandbox.sandbox_support()
        return TenantIsolation(isolated=support.available, note=support.summary)

    def isolation_note(self, job: Job) -> str:
        support = local_sandbox.sandbox_support()
        if not support.available:
            return (
                "Runs on the console's host without a sandbox (one trusted organisation "
                "only): " + support.reason
            )
        network = (
            "outbound network, nothing of the host's own services"
            if support.network
            else "no network"
        )
        return (
            f"Runs in a sandbox on the console's host: {self.limits(job).describe()}; "
            f"{network}; only its work dir ({local_sandbox.WORKSPACE}) is writable."
        )

    def volume_remove(self, *, tenant_id: int, volume_id: int) -> None:
        local_volumes.volume_remove(tenant_id=tenant_id, volume_id=volume_id)

    def volume_fill_folder(self, *, tenant_id: int, volume_id: int) -> Path:
        return local_volumes.fill_folder(tenant_id=tenant_id, volume_id=volume_id)

    def logs(self, job, since_line: int = 0, limit: int = 1000) -> list[LogLine]:
        """Numbered as the console's log store numbers this file (64 KiB pieces, the cap)."""
        path = self.log_path(job)
        if not path.exists():
            return []
        final = (path.parent / "exit_code").exists()
        return [
            LogLine(line_no=line.line_no, rank=line.rank, text=line.text)
            for line in FileLog(path).read(since_line, limit, final=final)
        ]
