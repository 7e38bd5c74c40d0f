"""The Jupyter server an environment's job runs, and how the console reaches it.

Debian's jupyter-server with the classic notebook UI (nbclassic) and an IPython kernel
(python3-jupyter-server, python3-nbclassic, python3-ipykernel: `make setup` installs
them), started by the job's bootstrap (environments.sshd) inside the host sandbox, on
JUPYTER_PORT of the job's own network, under `/env/<organisation>/<environment>/`: the
path the console's gateway (environments.proxy) serves it at, so its pages and links work
unchanged through the gateway. Its token is the console's (derived from the secret key,
never shown): the gateway adds it to every request, and the user only ever signs in to
the console. Nothing reaches the server but the gateway: its port is published on the
host's loopback, which jobs can't reach.
"""

from __future__ import annotations

import logging
from datetime import datetime

import httpx
from django.utils.crypto import salted_hmac
from django.utils.dateparse import parse_datetime

from environments.models import Environment, Interactive

logger = logging.getLogger(__name__)

JUPYTER_PORT = 8888
PORT_NAME = "jupyter"
TOKEN_VARIABLE = "ENVIRONMENT_JUPYTER_TOKEN"
PREFIX = "/env/"
# How long the idle pass waits for the server's answer (it then counts as active).
STATUS_TIMEOUT_SECONDS = 3.0


def has_jupyter(environment: Environment) -> bool:
    return environment.interactive in (Interactive.JUPYTER, Interactive.BOTH)


def has_ssh(environment: Environment) -> bool:
    return environment.interactive in (Interactive.SSH, Interactive.BOTH)


def base_path(environment: Environment) -> str:
    """Where the gateway serves the environment's Jupyter (its `base_url`)."""
    return f"{PREFIX}{environment.tenant.slug}/{environment.name}/"


def jupyter_token(environment: Environment) -> str:
    """The server's token: the console's own, stable across starts, different for every
    environment (and new when the environment is made again under the same name)."""
    return salted_hmac(
        "environments.jupyter", f"{environment.pk}:{environment.host_key_public}"
    ).hexdigest()


def server_arguments(*, base_url: str, root_dir: str) -> list[str]:
    """jupyter-server's command line (after `python3 -m jupyter_server`)."""
    return [
        "--no-browser",
        "--ip=0.0.0.0",  # the published port arrives on the sandbox's own interface
        f"--port={JUPYTER_PORT}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={base_url}",
        f"--ServerApp.root_dir={root_dir}",
        # The gateway is the one way in: it names the environment in the Host it sends.
        "--ServerApp.allow_remote_access=True",
        "--ServerApp.jpserver_extensions=nbclassic=True",
        "--ServerApp.default_url=/tree",
    ]


def activity(
    environment: Environment, address: tuple[str, int], *, since: datetime, now: datetime
) -> tuple[datetime | None, str]:
    """When the server was last active and what was read, for the idle rule: now while a
    kernel is busy or has a connected client; else the server's own last activity (API
    requests, kernel messages), not before `since`. (None, why) when it can't be read:
    counted as active."""
    host, port = address
    headers = {"Authorization": f"token {jupyter_token(environment)}"}
    base = f"http://{host}:{port}{base_path(environment)}"
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=STATUS_TIMEOUT_SECONDS) as http:
            status = http.get("api/status").raise_for_status().json()
            kernels = http.get("api/kernels").raise_for_status().json()
    except (httpx.HTTPError, ValueError) as error:
        return None, f"Jupyter can't be read ({type(error).__name__}): counted as active"
    busy = sum(1 for k in kernels if k.get("execution_state") == "busy")
    connected = sum(int(k.get("connections") or 0) for k in kernels)
    if busy or connected:
        return now, f"{busy} kernel(s) busy, {connected} connection(s) to kernels open"
    last = parse_datetime(str(status.get("last_activity") or ""))
    if last is None:
        return None, "Jupyter's last activity unreadable: counted as active"
    return max(last, since), f"{len(kernels)} kernel(s), none busy or connected"
