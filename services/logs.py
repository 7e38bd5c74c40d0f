"""A replica's latest log lines: what its process printed (on the console's host) or
its pod's container log (on a cluster). Read on demand; the page's live socket
(services.consumers) and the CLI follow by reading again and sending what is new."""

from __future__ import annotations

from jobs.backends import BackendRejected, BackendUnavailable, host_processes
from marketplace.models import Backend
from services.kubernetes import cluster
from services.models import ServiceReplica

MAX_TAIL = 5000
# What is read of a process's output for a tail (its lines are capped at 64 KiB).
TAIL_BYTES = 1 << 20


class LogsUnavailable(Exception):
    pass


def replica_log_lines(replica: ServiceReplica, *, tail: int = 200) -> list[str]:
    """The replica's last `tail` lines (1…MAX_TAIL), oldest first."""
    tail = max(1, min(tail, MAX_TAIL))
    if not replica.handle:
        return []
    if replica.service.pool.backend == Backend.KUBERNETES:
        try:
            text = cluster.pod_log_tail(
                cluster.backend(), replica.service, replica.handle, lines=tail
            )
        except (BackendUnavailable, BackendRejected) as error:
            raise LogsUnavailable(str(error)) from error
        return (text or "").splitlines()[-tail:]
    output = host_processes.host_output_tail(replica.handle, TAIL_BYTES)
    return output.decode(errors="replace").splitlines()[-tail:]


def lines_after(previous: list[str], current: list[str]) -> list[str]:
    """What `current` (a later tail) adds to `previous`: the lines after the longest end
    of `previous` that `current` starts with (all of `current` when they don't meet)."""
    for start in range(max(0, len(previous) - len(current)), len(previous)):
        overlap = previous[start:]
        if current[: len(overlap)] == overlap:
            return current[len(overlap) :]
    return current
