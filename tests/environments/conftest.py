"""Fixtures of the environment tests: SSH key pairs made by Debian's ssh-keygen, an SSH
gateway served on a free port in a thread of the test process, and a way to wait for an
environment's job on the local backend; a running CPU environment in the database only,
for the idle rule's tests."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from console.launcher import free_loopback_port
from console.services.ssh_keys import ssh_key_add
from environments import gateway, services
from environments.models import Environment
from environments.services import environment_sync
from jobs import services as job_services
from jobs.backends import get_backend
from tests.factories import ed25519_public_key_line
from tests.jobs_helpers import advance_to

SSH = shutil.which("ssh")
SSH_KEYGEN = shutil.which("ssh-keygen")


@dataclass
class KeyPair:
    private: Path
    public: str


def make_key_pair(directory: Path, name: str) -> KeyPair:
    if SSH_KEYGEN is None:
        pytest.fail("ssh-keygen is missing: apt-get install --no-install-recommends openssh-client")
    private = directory / name
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(private)], check=True
    )
    return KeyPair(private=private, public=private.with_suffix(".pub").read_text().strip())


@pytest.fixture
def key_pair(tmp_path):
    return lambda name: make_key_pair(tmp_path, name)


@dataclass
class RunningGateway:
    host: str
    port: int
    host_key_line: str  # the gateway's public key as a known_hosts line


@pytest.fixture
def ssh_gateway(tmp_path, settings):
    """The SSH gateway, listening on a free loopback port until the test ends."""
    port = free_loopback_port()
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "127.0.0.1", port
    settings.SSH_GATEWAY_PUBLIC_ADDRESS = ""
    host_key = gateway.gateway_host_key(tmp_path / "gateway_host_key")
    loop = asyncio.new_event_loop()
    started = threading.Event()
    acceptor = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            acceptor["server"] = await gateway.gateway_start(
                host="127.0.0.1", port=port, host_key=host_key
            )
            started.set()

        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=serve, name="ssh-gateway", daemon=True)
    thread.start()
    assert started.wait(10), "the SSH gateway did not start"
    public = host_key.export_public_key().decode().split()
    yield RunningGateway("127.0.0.1", port, f"[127.0.0.1]:{port} {public[0]} {public[1]}")
    loop.call_soon_threadsafe(acceptor["server"].close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def wait_for_environment(environment, statuses, timeout=30):
    """Let the watcher's pass observe the local backend until the environment's status
    is one of `statuses`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job_services.jobs_observe(backend_name="local")
        environment.refresh_from_db()
        environment_sync(environment=environment)
        if environment.status in statuses:
            return environment
        time.sleep(0.1)
    job = environment.current_job
    log = ""
    if job is not None:
        log = "\n".join(line.text for line in get_backend(job.backend).logs(job))
    raise AssertionError(f"environment stayed {environment.status}; job log:\n{log}")


@pytest.fixture
def running(world, catalog):
    """A CPU environment whose job has run for 55 minutes (idle policy: stop after 60,
    warned 10 before)."""
    ssh_key_add(user=world.member, public_key=ed25519_public_key_line())
    environment = services.environment_create(
        tenant=world.tenant, user=world.member, name="box", region="local",
        image="python-3.11", cpus=1,
    )  # fmt: skip
    services.environment_start(environment=environment, user=world.member)
    environment.refresh_from_db()
    advance_to(environment.current_job, "running", at=timezone.now() - timedelta(minutes=55))
    return Environment.objects.select_related("tenant", "current_job", "created_by").get(
        pk=environment.pk
    )
