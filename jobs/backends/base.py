"""The interface every compute backend implements."""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from marketplace.inventory import NodeInventory  # what inventory() reports

if TYPE_CHECKING:
    from jobs.extensions import VolumeMount
    from jobs.models import Job
    from marketplace.models import NodePool


class BackendUnavailable(Exception):
    """The backend can't be reached right now (API down, timeout): retry later."""


class ChaosRefused(Exception):
    """A chaos action the backend can't carry out as asked (the message says why)."""


class BackendRejected(Exception):
    """The backend refused the job for good (e.g. a Kubernetes 422): don't retry."""


# Where a job reads the files the console publishes to it while it runs (publish_file).
PUBLISHED_MOUNT = "/run/gpugeek"


@dataclass(frozen=True)
class Observation:
    """What the backend sees of one job's current attempt.

    phase: "pending" (accepted, not yet running), "running", "succeeded", "failed",
    "suspended" (paused and released), "preempted", "missing" (no backend object).
    """

    phase: str
    reason: str = ""
    exit_code: int | None = None


@dataclass(frozen=True)
class LogLine:
    line_no: int
    rank: int
    text: str


@dataclass(frozen=True)
class LogSource:
    """One rank's log in a job's current attempt (a pod's main container, the local
    job's output file). `key` names this log for good: a pod that replaces another for
    the same rank is a new source, so a reader can count what it already holds of each."""

    rank: int
    key: str
    live: bool  # still being written: following it waits for more lines


class LogStream(Protocol):
    """Complete lines of one source, after the first `skip`, as they are written.

    Reading happens in the background (or on each poll); `poll()` never blocks. A stream
    that ended (the container stopped, the connection broke, or `follow=False` and all
    was read) has `ended` set once `poll()` has returned its last lines."""

    source: LogSource
    skip: int  # lines of the source before the first one this stream returns

    def poll(self) -> list[str]:
        """The lines that arrived since the last call, in order."""
        ...

    @property
    def ended(self) -> bool: ...

    def close(self) -> None:
        """Stop reading now (callable from any thread); idempotent."""
        ...


@dataclass(frozen=True)
class LogFile:
    """A job's log kept by the backend as one numbered file: its only source (rank 0),
    line n being the file's n-th line."""

    path: Path
    complete: bool  # the writer has ended: a last line without its newline counts


@dataclass(frozen=True)
class GpuReading:
    """One GPU's reading at one moment, from NVML or a DCGM exporter."""

    node: str
    gpu: int
    utilization: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    # The machine the GPU is in (a Kubernetes node), where the reading says, and the XID
    # error it reports (None or 0: none): self-repair's evidence (jobs.repair).
    host: str = ""
    xid: int | None = None
    # Uncorrectable (double-bit) ECC errors since the driver loaded: any is a fault.
    ecc_dbe: int | None = None

    @property
    def faulty(self) -> bool:
        return bool(self.xid or self.ecc_dbe)

    @property
    def fault(self) -> str:
        """The fault in words ("XID 79", "2 double-bit ECC errors")."""
        parts = [f"XID {self.xid}"] if self.xid else []
        if self.ecc_dbe:
            parts.append(f"{self.ecc_dbe} double-bit ECC error{'s' if self.ecc_dbe > 1 else ''}")
        return ", ".join(parts)


@dataclass(frozen=True)
class TenantIsolation:
    """Can jobs of several tenants share this backend safely? `note` says how (or why
    not), for staff."""

    isolated: bool
    note: str = ""


def node_memory_share(job: Job, pool: NodePool | None) -> float | None:
    """The job's share of a node's memory: its share of the node's GPUs, or of its vCPUs
    for CPU jobs (at most the whole node); None when the pool doesn't say. Both backends
    size a job's memory limit by it."""
    if pool is None:
        return None
    if job.gpus_per_node and pool.gpus_per_node:
        return min(job.gpus_per_node / pool.gpus_per_node, 1.0)
    if job.cpus and pool.vcpus_per_node:
        return min(job.cpus / pool.vcpus_per_node, 1.0)
    return None


@dataclass(frozen=True)
class FillRun:
    """Where a volume fill's copy on a cluster stands: `phase` running, succeeded, failed
    or gone (its objects were deleted), the copy's newest report (bytes, files, total;
    error) and, for a failure the copy didn't explain, the cluster's reason."""

    phase: str
    report: dict
    reason: str = ""


class ChaosControls(abc.ABC):
    """Faults staff can inject into a simulated backend, to watch the console cope.
    Each raises ChaosRefused (bad request) or BackendUnavailable."""

    @abc.abstractmethod
    def nodes(self) -> list[dict]:
        """Every node: name, pool, tier, ready, pods."""

    @abc.abstractmethod
    def reclaim_spot(self, pool_slug: str) -> dict:
        """Take a spot pool's capacity back: its pods are disrupted as by the cloud."""

    @abc.abstractmethod
    def fail_node(self, node: str) -> dict:
        """The node stops answering and its pods are disrupted."""

    @abc.abstractmethod
    def recover_node(self, node: str) -> dict:
        """A failed node is back (and reports no XID error)."""

    @abc.abstractmethod
    def xid_error(self, node: str, code: int) -> dict:
        """The node's GPUs report XID error `code` in their DCGM readings."""

    @abc.abstractmethod
    def stuck_gpus(self, node: str) -> dict:
        """The node's GPUs hang: its pods run on, reading 0 % busy."""

    @abc.abstractmethod
    def api_faults(self, *, mode: str, fraction: float, seconds: float, delay: float) -> dict:
        """For `seconds`, `fraction` of API calls fail (mode "error") or are slow."""

    @abc.abstractmethod
    def clear_api_faults(self) -> dict:
        """End injected API faults now."""


class ComputeBackend(abc.ABC):
    """Everything the console asks of a place where work runs.

    Code outside `jobs/backends/` talks to a backend only through this class: it never
    compares backend names or probes for methods. Operations that only some backends
    need have documented no-op defaults; what differs in behaviour is said by the
    capability attributes below. A new backend (a sandbox cluster, a cloud) implements
    the abstract methods and overrides the defaults it needs.
    """

    name: str = ""
    # submit() leaves the attempt running (a local process) rather than accepted and
    # still to be scheduled (pods): the job goes straight to `running`.
    starts_immediately: bool = False
    # The console picks the attempt's GPU devices (assign_devices) before submit/resume.
    assigns_devices: bool = False
    # A finished job leaves objects behind (a Service, a Secret) that release() removes.
    releases_after_finish: bool = False
    # Jobs told to stop must be killed by the console when their grace period ends.
    enforces_grace: bool = False
    # Its work runs on the console's own machine, which is no security boundary: its
    # pools are offered only to tenants staff allow to run on the host.
    runs_on_console_host: bool = False
    # The backend keeps its own copy of tenants' registry logins (remove_pull_secret
    # removes it when the tenant deletes the login).
    copies_pull_secrets: bool = False
    # Its nodes and workloads are simulated (the sandbox cluster): the UI says so.
    simulated: bool = False

    @classmethod
    def from_settings(cls) -> ComputeBackend:
        """The backend as settings configure it (what the registry builds). Building it
        never calls out: a backend that can't be reached fails on its first call."""
        return cls()

    def chaos(self) -> ChaosControls | None:
        """Fault injection, where the backend is simulated; None elsewhere."""
        return None

    # --- capacity ---

    @abc.abstractmethod
    def inventory(self) -> list[NodeInventory]:
        """Every node this backend can place work on, with capacity and current use."""

    # --- lifecycle ---

    @abc.abstractmethod
    def submit(self, job: Job) -> None:
        """Start the job's current attempt. Idempotent: an existing attempt is success."""

    def submit_many(self, jobs: list[Job]) -> dict[int, Exception | None]:
        """`submit` each job; returns each one's error, or None where it started. A
        backend that can overlap the calls (Kubernetes) does them at once."""
        outcomes: dict[int, Exception | None] = {}
        for job in jobs:
            try:
                self.submit(job)
            except Exception as error:
                outcomes[job.pk] = error
            else:
                outcomes[job.pk] = None
        return outcomes

    @abc.abstractmethod
    def suspend(self, job: Job) -> None:
        """Stop the attempt with notice (SIGTERM, grace period) and release its compute."""

    @abc.abstractmethod
    def resume(self, job: Job) -> None:
        """Start a suspended attempt again, with GPUGEEK_RESUMED=1."""

    @abc.abstractmethod
    def cancel(self, job: Job) -> None:
        """Stop the attempt for good and remove what it runs. Idempotent."""

    def release(self, job: Job) -> None:  # noqa: B027 - a documented no-op default
        """Remove what a finished job left behind (`releases_after_finish`). Idempotent."""

    def stored_job_ids(self) -> set[int]:
        """Jobs of which the backend keeps files on its own disk (a local job's work and
        run directories); none elsewhere."""
        return set()

    def discard(self, job_ids: list[int], *, logs: bool = True) -> None:  # noqa: B027
        """Remove those files (a documented no-op default): the work files, and with
        `logs` the job's output too. Idempotent."""

    def volume_remove(self, *, tenant_id: int, volume_id: int) -> None:  # noqa: B027
        """Delete a deleted volume's storage here (its folder, its claim), if any: a
        documented no-op default. Idempotent."""

    def volume_resize(self, *, tenant_id: int, volume_id: int, size_gib: int) -> None:  # noqa: B027
        """Grow a volume's storage here, where it exists already (a claim's request); a
        documented no-op default (the local backend reads the size at each start)."""

    def volume_fill_folder(self, *, tenant_id: int, volume_id: int) -> Path | None:
        """The volume's folder on the console's own disk, made if need be, for a fill
        (storage.services) to copy into; None (the default) where a volume lives
        elsewhere (a claim in a cluster)."""
        return None

    def volume_fill_start(
        self,
        *,
        tenant_id: int,
        mount: VolumeMount,
        fill_id: int,
        attempt: int,
        source: str,
        endpoint: str,
        credential: str,
    ) -> bool:
        """Start run `attempt` of a fill where the volume lives (a copy pod on a
        cluster); False (the default) where this backend can't, as for one whose volumes
        are folders on the console's host (`volume_fill_folder`)."""
        return False

    def volume_fill_status(self, *, tenant_id: int, fill_id: int, attempt: int) -> FillRun:
        """Where a run started by `volume_fill_start` stands; a backend that starts none
        (the default) has none to report: gone."""
        return FillRun(phase="gone", report={}, reason="This backend runs no volume copies.")

    def volume_fill_stop(self, *, tenant_id: int, fill_id: int, attempt: int) -> None:  # noqa: B027
        """Stop and remove a fill run (cancelled, failed or done); gone is fine. A
        documented no-op default, for backends that start none."""

    def tenant_isolation(self) -> TenantIsolation:
        """Whether this backend keeps one tenant's jobs from the console and from other
        tenants (a pod boundary does; the console's host needs a sandbox)."""
        return TenantIsolation(isolated=True)

    def isolation_note(self, job: Job) -> str:
        """What `job` may use and reach where it runs, for its page ("" to say nothing)."""
        return ""

    def enforce_grace(self, job: Job, grace_seconds: int) -> bool:
        """Kill a job told to stop whose grace period is over (`enforces_grace`).
        Returns whether it killed something."""
        return False

    def assign_devices(self, job: Job, busy: set[int]) -> list[int]:
        """The GPU device indexes the attempt gets, none of them in `busy`
        (`assigns_devices`). Raises BackendRejected when too few are free."""
        return []

    # --- observation ---

    @abc.abstractmethod
    def observe(self, job: Job) -> Observation:
        """The attempt's state as the backend sees it now."""

    def watch(self, stop: threading.Event, on_change: Callable[[int], None]) -> bool:
        """Follow changes in a thread, calling `on_change(job_id)` for each job that may
        have changed, until `stop` is set. Returns False when this backend has no watch
        (the watcher then polls it)."""
        return False

    def publish_file(self, job: Job, name: str, text: str) -> bool:
        """Put a small file the console writes where the job's current attempt reads it,
        read-only, at PUBLISHED_MOUNT/`name` (replaced whole: a reader sees the old file
        or the new one); False where this backend can't (the job then has only what it
        was started with). Readable by anyone on the host: nothing secret goes there."""
        return False

    def port_address(self, job: Job, port: int) -> tuple[str, int] | None:
        """Where the console's own processes reach `port`, one the job declared in its
        `ports`, while its attempt runs (an SSH gateway dials it); None where this backend
        doesn't publish the job's ports to the console."""
        return None

    def gpu_readings(self, jobs: list[Job]) -> dict[int, list[GpuReading]]:
        """Current per-GPU readings of running `jobs` (by job id); jobs without readings
        are left out. Raises BackendUnavailable when the metrics source can't be read."""
        return {}

    def metrics_note(self, job: Job) -> str:
        """Why `job` has no GPU readings on this backend ("" when it should have some)."""
        return ""

    def node_cordon(self, node: str, *, cordoned: bool = True) -> bool:
        """Mark `node` unschedulable (or schedulable again) on the cluster, so that no new
        work lands there; False where this backend has no such nodes or isn't allowed to
        (the console then only keeps the node out of its own capacity)."""
        return False

    # --- logs ---

    @abc.abstractmethod
    def log_sources(self, job: Job) -> list[LogSource]:
        """The current attempt's rank logs that can be read now (started containers)."""

    @abc.abstractmethod
    def open_log(
        self,
        job: Job,
        source: LogSource,
        *,
        skip: int = 0,
        follow: bool = True,
        wake: Callable[[], None] | None = None,
    ) -> LogStream:
        """Read `source` after its first `skip` lines: what is there (`follow=False`), or
        also each line as it is written until the source ends or `close()`. One stream
        per source serves every viewer (jobs.logs numbers and publishes its lines);
        `wake` is called from the reading thread when lines arrive, so a follower need
        not poll."""

    def log_file(self, job: Job) -> LogFile | None:
        """The job's log as one file this backend numbers itself, read in place by
        jobs.logs (it may not exist yet); reading it creates nothing. None (the default)
        when jobs.logs numbers the lines of `log_sources` in a spool of its own (several
        ranks, pods that come and go)."""
        return None

    @abc.abstractmethod
    def logs(self, job: Job, since_line: int = 0, limit: int = 1000) -> list[LogLine]:
        """Log lines after `since_line` (1-based, global across ranks)."""

    # --- credentials ---

    def remove_pull_secret(self, tenant_id: int, registry: str) -> None:  # noqa: B027
        """A tenant removed its login to `registry`: remove the backend's copy, if any."""
