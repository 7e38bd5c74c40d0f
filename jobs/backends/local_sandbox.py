"""The sandbox a local job runs in: what it may see, reach and use on the console's host.

A host job is untrusted code on the machine that holds the console's secrets, database and
other tenants' work. It runs inside a bubblewrap sandbox (user, PID, mount, IPC, UTS and
network namespaces; Debian's `bwrap`, the tool rootless containers use) that the job's
supervisor starts as an unprivileged host uid of the job's own (never the console's user or
root), so the kernel's permission checks apply to it outside the namespaces too. Inside:
- the host's OS read-only (/usr, /etc, /sys), a fresh /proc showing only its own
  processes, a minimal /dev plus the GPUs assigned to it, a private /tmp (in its work dir)
  and /dev/shm; its work dir at /workspace is the only writable path; no path of the
  console's data dir, code or other jobs exists there at all;
- outbound network through slirp4netns with the host's loopback, the host's own addresses
  and LOCAL_EGRESS_DENY_CIDRS unreachable (console running as root; else no network);
- limits from its spec: memory (its share of the node, as on Kubernetes), processes and
  its work dir's size; the supervisor stops it with the reason when it passes one.

This module decides the plan (pure, on the console's side); `local_supervisor` carries it
out. Where bwrap is missing or can't create namespaces, `sandbox_support()` says why, and
the console allows host access to one organisation only (`host_isolation`).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from jobs.backends.base import PUBLISHED_MOUNT, node_memory_share
from jobs.backends.local_checkpoints import CHECKPOINT_MOUNT

if TYPE_CHECKING:
    from jobs.models import Job
    from marketplace.models import NodePool

# Where the job sees its work dir, and the uid/gid it has inside (named in its /etc/passwd).
WORKSPACE = "/workspace"
SANDBOX_TMP = "/tmp"  # noqa: S108  (the job's own: its work dir's tmp/, bound there)
INNER_UID = 1000
INNER_USER = "job"
# `python` for jobs: the host's python3 (Debian has no `python` without python-is-python3).
SHIM_BIN = "/opt/gpugeek/bin"
SANDBOX_PATH = f"{SHIM_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# NVIDIA's control devices, bound where they exist; each assigned GPU adds /dev/nvidia<N>.
NVIDIA_CONTROL_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps",
)
# The host's OS, read-only. /lib* and /bin are symlinks into /usr on merged-/usr systems
# (Debian 12): bound as they are on the host, a link stays a link.
SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
SLIRP_DNS = "10.0.2.3"


@dataclass(frozen=True)
class SandboxSupport:
    """What this host offers host jobs; `reason` says what is missing, for staff."""

    available: bool
    reason: str = ""
    network: bool = False  # outbound network through slirp4netns
    own_uid: bool = False  # jobs run as their own unprivileged host uid (console is root)

    @property
    def summary(self) -> str:
        if not self.available:
            return f"Host jobs are not sandboxed: {self.reason}"
        parts = ["Host jobs run in a bubblewrap sandbox"]
        parts.append("as their own unprivileged user" if self.own_uid else "as the console's user")
        parts.append("with outbound network" if self.network else "without network")
        text = ", ".join(parts) + "."
        return f"{text} {self.reason}".strip()


def _probe_argv(bwrap: str) -> list[str]:
    return [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        "/bin/true",
    ]


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _untraversable_ancestor(path: Path) -> Path | None:
    """The first directory above `path` that another user can't pass through."""
    for parent in [*reversed(path.resolve().parents)]:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return parent
    return None


@functools.cache
def sandbox_support() -> SandboxSupport:
    """Probe once per process: is bwrap there, and can it create the namespaces as the
    user jobs will run as? Cached: the answer changes only with the host's packages."""
    if not settings.LOCAL_JOB_SANDBOX:
        return SandboxSupport(False, "it is turned off (LOCAL_JOB_SANDBOX=0).")
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return SandboxSupport(
            False, "bubblewrap is not installed (apt-get install bubblewrap slirp4netns)."
        )
    own_uid = os.geteuid() == 0
    if own_uid:
        blocked = _untraversable_ancestor(work_root())
        if blocked is not None:
            return SandboxSupport(
                False,
                f"job users can't reach the job work dir {work_root()}: {blocked} is closed "
                "to other users. Set LOCAL_JOB_WORK_DIR to a directory under a path every "
                "user may pass through (e.g. /var/lib/gpugeek-work).",
            )
    uid = settings.LOCAL_JOB_UID_BASE if own_uid else None
    gid = settings.LOCAL_JOB_GID_BASE if own_uid else None
    try:
        probe = subprocess.run(  # noqa: S603  (fixed argv)
            _probe_argv(bwrap),
            capture_output=True,
            text=True,
            timeout=20,
            user=uid,
            group=gid,
            extra_groups=[] if own_uid else None,
            env={"PATH": "/usr/bin:/bin"},
        )
    except (OSError, subprocess.SubprocessError) as error:
        return SandboxSupport(False, f"bubblewrap could not run: {error}.")
    if probe.returncode != 0:
        detail = (probe.stderr or probe.stdout).strip().splitlines()
        return SandboxSupport(
            False,
            "bubblewrap can't create namespaces here"
            + (f" ({detail[-1]})" if detail else "")
            + ": unprivileged user namespaces may be disabled (kernel.unprivileged_userns_clone"
            " or user.max_user_namespaces).",
        )
    network_missing = [name for name in ("slirp4netns", "nsenter", "ip") if not shutil.which(name)]
    if not own_uid:
        return SandboxSupport(
            True,
            "Run the console as root to give each job its own host uid and outbound network.",
            network=False,
            own_uid=False,
        )
    if network_missing:
        return SandboxSupport(
            True,
            f"No outbound network for jobs: {', '.join(network_missing)} missing "
            "(apt-get install slirp4netns iproute2 util-linux).",
            network=False,
            own_uid=True,
        )
    return SandboxSupport(True, network=True, own_uid=True)


def work_root() -> Path:
    """Where local jobs' work dirs live: outside the console's private data dir (job users
    must pass through its parents to reach their own dir; they can't list it)."""
    if settings.LOCAL_JOB_WORK_DIR:
        return Path(settings.LOCAL_JOB_WORK_DIR)
    data_dir = Path(settings.DATA_DIR)
    return data_dir.with_name(f"{data_dir.name}-work")


def job_uid(job: Job) -> int:
    """The job's own host uid: one per job, from the reserved range (LOCAL_JOB_UID_BASE,
    LOCAL_JOB_ID_COUNT ids), so its process limit and signals reach only it."""
    return settings.LOCAL_JOB_UID_BASE + job.pk % settings.LOCAL_JOB_ID_COUNT


def tenant_gid(tenant_id: int) -> int:
    """The organisation's host gid: its jobs share files (volumes) through it, never with
    another organisation's."""
    return settings.LOCAL_JOB_GID_BASE + tenant_id % settings.LOCAL_JOB_ID_COUNT


@dataclass(frozen=True)
class JobLimits:
    memory_bytes: int
    processes: int
    disk_bytes: int

    def describe(self) -> str:
        gib = 1 << 30
        return (
            f"{self.memory_bytes / gib:.1f} GiB memory, {self.processes:,} processes, "
            f"{self.disk_bytes / gib:.1f} GiB disk in its work dir"
        )


def job_limits(job: Job, pool: NodePool | None) -> JobLimits:
    """The job's limits on the host: its share of the host's memory (as its pods get of a
    node on Kubernetes, 10 % kept for the host), the process cap and the work dir cap."""
    share = node_memory_share(job, pool)
    memory = int(psutil.virtual_memory().total * (1.0 if share is None else share) * 0.9)
    return JobLimits(
        memory_bytes=max(memory, 256 << 20),
        processes=settings.LOCAL_JOB_MAX_PROCESSES,
        disk_bytes=int(settings.LOCAL_JOB_DISK_GIB * (1 << 30)),
    )


def _host_addresses() -> list[str]:
    """This host's own IPv4 addresses: a server listening on them (PostgreSQL on
    0.0.0.0, say) is the console's, never a job's to reach."""
    addresses = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family.name == "AF_INET":
                addresses.add(f"{entry.address}/32")
    return sorted(addresses)


def egress_deny_cidrs() -> list[str]:
    """IPv4 networks a job's traffic never reaches (routes that refuse it in the job's
    network namespace; slirp4netns has no IPv6 unless asked, so IPv6 reaches nothing)."""
    cidrs = []
    for cidr in [*settings.LOCAL_EGRESS_DENY_CIDRS, *_host_addresses()]:
        network = ipaddress.ip_network(cidr, strict=False)
        if network.version == 4 and not network.is_loopback:
            cidrs.append(str(network))
    return cidrs


def _plain_file(path: str) -> bool:
    return os.path.isfile(path) and not os.path.islink(path)


def _device_binds(devices: list[int]) -> list[str]:
    args: list[str] = []
    if not devices:
        return args
    for path in NVIDIA_CONTROL_DEVICES:
        args += ["--dev-bind-try", path, path]
    for index in devices:  # (-try: a host whose driver makes no device node has none)
        args += ["--dev-bind-try", f"/dev/nvidia{int(index)}", f"/dev/nvidia{int(index)}"]
    return args


def volume_bind_args(volumes: list[tuple[Path, str, bool]]) -> list[str]:
    args: list[str] = []
    for folder, path, read_only in volumes:
        args += ["--ro-bind" if read_only else "--bind", str(folder), path]
    return args


def sandbox_plan(
    *,
    job: Job,
    workdir: Path,
    env: dict[str, str],
    limits: JobLimits,
    checkpoints: Path | None = None,
    volumes: list[tuple[Path, str, bool]] | None = None,
    published: Path | None = None,
) -> dict:
    """What the supervisor runs: the bubblewrap options (handed to it in a file
    descriptor, never in argv where `ps` shows them), the files the job sees in /etc, the
    host uid/gid to drop to, the network and the limits. JSON-ready. `checkpoints`: the
    job's own checkpoint folder, bind-mounted at CHECKPOINT_MOUNT (nothing else of the
    store is visible). `published`: the console's folder of files for the job
    (ComputeBackend.publish_file), read-only at PUBLISHED_MOUNT."""
    support = sandbox_support()
    return process_plan(
        hostname=f"gpugeek-job-{job.pk}",
        devices=[int(index) for index in job.assigned_devices or []],
        uid=job_uid(job) if support.own_uid else None,
        gid=tenant_gid(job.tenant_id) if support.own_uid else None,
        workdir=workdir,
        env=env,
        limits=limits,
        binds=[
            *(["--bind", str(checkpoints), CHECKPOINT_MOUNT] if checkpoints else []),
            *(["--ro-bind", str(published), PUBLISHED_MOUNT] if published else []),
            *volume_bind_args(volumes or []),
        ],
    )


def process_plan(
    *,
    hostname: str,
    devices: list[int],
    uid: int | None,
    gid: int | None,
    workdir: Path,
    env: dict[str, str],
    limits: JobLimits,
    binds: list[str] | None = None,
) -> dict:
    """The plan of `sandbox_plan` for any process the console runs on its host (a job, a
    service's replica): the same sandbox, named and owned as the caller says. `binds`:
    bubblewrap bind options for what else it sees (a checkpoint folder, volumes)."""
    support = sandbox_support()
    args = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--uid",
        str(INNER_UID),
        "--gid",
        str(INNER_UID),
        "--hostname",
        hostname,
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *_device_binds(devices),
        "--size",
        str(min(limits.memory_bytes, 8 << 30)),
        "--tmpfs",
        "/dev/shm",  # noqa: S108  (the sandbox's own, sized)
        "--bind",
        str(workdir),
        WORKSPACE,
        "--bind",
        str(workdir / "tmp"),
        SANDBOX_TMP,
        # After the work dir, so a volume may sit inside it.
        *(binds or []),
        "--dir",
        SHIM_BIN,
        "--symlink",
        "/usr/bin/python3",
        f"{SHIM_BIN}/python",
        "--chdir",
        WORKSPACE,
        "--clearenv",
    ]
    for name, value in env.items():
        args += ["--setenv", name, value]
    passwd = (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{INNER_USER}:x:{INNER_UID}:{INNER_UID}:GpuGeek job:{WORKSPACE}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:0:\n{INNER_USER}:x:{INNER_UID}:\nnogroup:x:65534:\n"
    files = {"/etc/passwd": passwd, "/etc/group": group}
    if support.network:
        files["/etc/resolv.conf"] = f"nameserver {SLIRP_DNS}\n"
    # A file is shown over the host's only where the host has a plain file (a symlink into
    # /run would point nowhere inside).
    files = {path: text for path, text in files.items() if _plain_file(path)}
    return {
        "bwrap": shutil.which("bwrap"),
        "args": args,
        "files": files,
        "uid": uid,
        "gid": gid,
        "network": (
            {
                "slirp4netns": shutil.which("slirp4netns"),
                "nsenter": shutil.which("nsenter"),
                "ip": shutil.which("ip"),
                "deny": egress_deny_cidrs(),
            }
            if support.network
            else None
        ),
        "limits": {
            "memory_bytes": limits.memory_bytes,
            "processes": limits.processes,
            "disk_bytes": limits.disk_bytes,
        },
    }


@receiver(setting_changed)
def _forget_support(*, setting: str, **kwargs) -> None:
    # Tests (and override_settings) change what the probe depends on.
    if setting.startswith("LOCAL_JOB_"):
        sandbox_support.cache_clear()
