"""`client.environments`: the organisation's dev environments (a box to work on over SSH),
by name: create, start, stop, keep running, delete, and the OpenSSH command that reaches
one through the console's SSH gateway."""

from __future__ import annotations

import shlex
import time
from typing import Any
from urllib.parse import quote

from gpugeek.errors import GpuGeekError
from gpugeek.http import Transport
from gpugeek.models import Environment

# An environment in one of these has stopped changing on its own (idle_warning may stop).
SETTLED = ("running", "stopped", "failed")


def _path(name: str, action: str = "") -> str:
    return f"environments/{quote(name, safe='')}" + (f"/{action}" if action else "")


class Environments:
    def __init__(self, http: Transport):
        self.http = http

    def list(self) -> list[Environment]:
        return [Environment.from_dict(row) for row in self.http.paginate("environments")]

    def get(self, name: str) -> Environment:
        return Environment.from_dict(self.http.get(_path(name)))

    def create(
        self,
        name: str,
        *,
        region: str,
        image: str,
        cpus: int | None = None,
        gpu_type: str | None = None,
        gpus_per_node: int = 0,
        interactive: str = "ssh",
        home_volume: str | None = None,
        home_volume_gib: int | None = None,
        volumes: list[dict[str, Any]] | None = None,
        env: dict[str, str] | None = None,
        secrets: list[str] | None = None,
        idle_policy: dict[str, Any] | None = None,
    ) -> Environment:
        """Create a stopped environment and its home volume (`<name>-home`) unless
        `home_volume` names one. A `Conflict` when the name is taken; a
        `ValidationError` naming the field for bad input."""
        body: dict[str, Any] = {
            "name": name, "region": region, "image": image, "interactive": interactive,
            "gpus_per_node": gpus_per_node,
        }  # fmt: skip
        optional = {
            "cpus": cpus, "gpu_type": gpu_type, "home_volume": home_volume,
            "home_volume_gib": home_volume_gib, "volumes": volumes, "env": env,
            "secrets": secrets, "idle_policy": idle_policy,
        }  # fmt: skip
        body.update({key: value for key, value in optional.items() if value is not None})
        return Environment.from_dict(self.http.post("environments", body))

    def update(self, name: str, **changes: Any) -> Environment:
        """Change image, cpus, gpu_type, gpus_per_node, interactive, volumes, env,
        secrets or idle_policy; it applies from the next start."""
        return Environment.from_dict(self.http.request("PATCH", _path(name), json=changes))

    def start(self, name: str) -> Environment:
        """Start it (a new job); a `Conflict` while it runs or its home volume is held."""
        return Environment.from_dict(self.http.post(_path(name, "start"), {}))

    def stop(self, name: str) -> Environment:
        """Stop it; the home volume and its files stay. A `Conflict` when stopped."""
        return Environment.from_dict(self.http.post(_path(name, "stop"), {}))

    def keep_alive(self, name: str, *, minutes: int = 0) -> Environment:
        """Count as activity for the idle rule now, or until `minutes` from now (at most
        a day); ends an idle warning. A `Conflict` when it isn't running."""
        answer = self.http.post(_path(name, "keep-alive"), {"minutes": int(minutes)})
        return Environment.from_dict(answer)

    def delete(self, name: str, *, keep_volume: bool) -> None:
        """Delete a stopped environment; `keep_volume` says whether its home volume (and
        the files on it) stays."""
        keep = "true" if keep_volume else "false"
        self.http.request("DELETE", _path(name), params={"keep_volume": keep})

    def wait(
        self, name: str, *, statuses=SETTLED, timeout: float = 600, poll: float = 2
    ) -> Environment:
        """The environment once its status is one of `statuses`; GpuGeekError after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            environment = self.get(name)
            if environment.status in statuses:
                return environment
            if time.monotonic() >= deadline:
                raise GpuGeekError(f"environment {name} is still {environment.status}")
            time.sleep(poll)

    def ssh_argv(
        self, name: str, command: list[str] | None = None, *, options: list[str] | None = None
    ) -> list[str]:
        """The OpenSSH command line that reaches a running environment (the console's
        `ssh_command`) with ssh `options` (e.g. ["-F", file]) and `command` to run there;
        GpuGeekError when it isn't running."""
        environment = self.get(name)
        if environment.status not in ("running", "idle_warning"):
            stopped = environment.status == "stopped"
            hint = f"; start it: gpugeek env start {name}" if stopped else ""
            raise GpuGeekError(f"environment {name} is {environment.status}{hint}")
        if not environment.ssh_command:
            raise GpuGeekError(
                f"environment {name} has no SSH (only Jupyter: {environment.jupyter_url})"
            )
        program, *rest = shlex.split(environment.ssh_command)
        return [program, *(options or []), *rest, *(command or [])]
