"""The interface every compute backend implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from jobs.models import Job


class BackendUnavailable(Exception):
    """The backend can't be reached right now (API down, timeout): retry later."""


class BackendRejected(Exception):
    """The backend refused the job for good (e.g. a Kubernetes 422): don't retry."""


@dataclass(frozen=True)
class NodeInventory:
    """One node as the backend reports it, in backend-neutral terms."""

    name: str
    region: str
    tier: str  # on_demand | spot | reserved
    labels: dict[str, str] = field(default_factory=dict)
    gpu_resource: str | None = None  # e.g. "nvidia.com/gpu"
    gpu_product: str | None = None  # e.g. "NVIDIA-H100-80GB-HBM3" or an NVML name
    gpus_allocatable: int = 0
    gpus_in_use: int = 0
    vcpus_allocatable: int = 0
    vcpus_in_use: int = 0
    memory_gib: int = 0
    schedulable: bool = True


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


class ComputeBackend(Protocol):
    name: str

    def inventory(self) -> list[NodeInventory]:
        """Every node this backend can place work on, with capacity and current use."""
        ...

    def submit(self, job: Job) -> None:
        """Start the job's current attempt. Idempotent: an existing attempt is success."""
        ...

    def suspend(self, job: Job) -> None:
        """Stop the attempt with notice (SIGTERM, grace period) and release its compute."""
        ...

    def resume(self, job: Job) -> None:
        """Start a suspended attempt again, with GPUGEEK_RESUMED=1."""
        ...

    def cancel(self, job: Job) -> None:
        """Stop the attempt for good and remove what it runs. Idempotent."""
        ...

    def observe(self, job: Job) -> Observation:
        """The attempt's state as the backend sees it now."""
        ...

    def logs(self, job: Job, since_line: int = 0, limit: int = 1000) -> list[LogLine]:
        """Log lines after `since_line` (1-based, global across ranks)."""
        ...

    def log_sources(self, job: Job) -> list[LogSource]:
        """The current attempt's rank logs that can be read now (started containers)."""
        ...

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
        per source serves every viewer (jobs.logstream numbers and publishes its lines);
        `wake` is called from the reading thread when lines arrive, so a follower need
        not poll."""
        ...
