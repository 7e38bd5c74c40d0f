"""The ports a host job declares (`Job.ports`), published to the console's host.

A sandboxed job's network namespace is its own (slirp4netns), so nothing outside reaches
a server it runs. As for a service's replica (`host_processes`), each declared port is
forwarded from a free port on the host's loopback (slirp4netns' `add_hostfwd`, done by
the supervisor once the sandbox's network is up); the console records which loopback
port serves which declared port in the job's run directory, a file the job can't reach.
Host jobs can't reach the host's loopback (`--disable-host-loopback`): only the
console's own processes (an SSH gateway) dial these ports. Without the sandbox's network
nothing is published (`port_address` is None)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from console.launcher import free_loopback_port

if TYPE_CHECKING:
    from jobs.models import Job

PORTS_FILE = "ports.json"


def publish_job_ports(plan: dict, *, job: Job, run_dir: Path) -> None:
    """Add the job's declared ports to its sandbox plan and record where each will be
    reached (a new loopback port per start)."""
    (run_dir / PORTS_FILE).unlink(missing_ok=True)
    if not job.ports or not plan.get("network"):
        return
    published = {int(port["port"]): free_loopback_port() for port in job.ports}
    plan["network"]["publish"] = {
        "api_socket": str(run_dir / "slirp.sock"),
        "ports": [{"host_port": host, "guest_port": guest} for guest, host in published.items()],
    }
    (run_dir / PORTS_FILE).write_text(json.dumps({str(k): v for k, v in published.items()}))


class LocalPorts:
    """The local backend's `port_address` (ComputeBackend's interface)."""

    def run_dir(self, job: Job) -> Path:
        raise NotImplementedError

    def port_address(self, job: Job, port: int) -> tuple[str, int] | None:
        published: dict = {}
        with contextlib.suppress(OSError, ValueError):
            published = json.loads((self.run_dir(job) / PORTS_FILE).read_text())
        host_port = published.get(str(int(port)))
        return ("127.0.0.1", int(host_port)) if host_port else None
