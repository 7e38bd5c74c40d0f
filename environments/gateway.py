"""The SSH gateway: the one way from a laptop to an environment's sshd.

An asyncssh server on one port (SSH_GATEWAY_HOST:SSH_GATEWAY_PORT) used as an OpenSSH
jump host: `ssh -J <env>.<org>@gateway job@<env>.<org>`. The login names the
environment; the gateway accepts only public keys, and only those of the members who
may use that environment now (read from the database on every connection: a removed
member's key fails at once). It then forwards the client's direct-tcpip channel to the
environment's sshd, whatever host the client asked for, so the laptop talks SSH end to
end with the environment (its host key, scp, sftp and IDEs as usual). It offers no
shell of its own: a session opened on it only says how to connect.

Every refusal looks alike (no key matches), so a login doesn't tell whether an
environment or organisation exists."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import asyncssh
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from console.ssh_public_keys import fingerprint_sha256
from environments import selectors, services

logger = logging.getLogger(__name__)
RETRY_SECONDS = 10
# An open connection is activity for the idle rule: recorded this often while it lasts.
ACTIVITY_SECONDS = 60


def _in_database(function, **kwargs):
    """Run a read or write of the console's in the database thread: a long-running
    gateway drops connections the database closed meanwhile, as Django's requests do."""

    def call():
        close_old_connections()
        try:
            return function(**kwargs)
        finally:
            close_old_connections()

    return sync_to_async(call)()


def gateway_host_key(path: Path | None = None) -> asyncssh.SSHKey:
    """The gateway's own host key, made once and kept in the data dir (0600)."""
    path = path or Path(settings.DATA_DIR) / "ssh-gateway" / "host_key"
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = asyncssh.generate_private_key("ssh-ed25519")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(key.export_private_key())
    return asyncssh.read_private_key(str(path))


class GatewayServer(asyncssh.SSHServer):
    """One client connection."""

    def __init__(self) -> None:
        self._connection: asyncssh.SSHServerConnection | None = None
        self._route: selectors.GatewayRoute | None = None
        self._signed_in: tuple[int, str] | None = None  # (user id, key fingerprint)
        self._activity: asyncio.Task | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._connection = conn

    def connection_lost(self, exc: Exception | None) -> None:
        if self._activity is not None:
            self._activity.cancel()

    async def _record_activity(self, environment_id: int) -> None:
        """While the connection is open, its environment isn't idle."""
        while True:
            await asyncio.sleep(ACTIVITY_SECONDS)
            try:
                await _in_database(services.environment_ssh_activity, environment_id=environment_id)
            except DatabaseError:
                logger.exception("SSH gateway: could not record activity")

    async def begin_auth(self, username: str) -> bool:
        try:
            self._route = await _in_database(selectors.gateway_route, login=username)
        except DatabaseError:  # refused like a wrong key, and logged for staff
            logger.exception("SSH gateway: the database did not answer for %r", username)
        return True  # always ask for a key, whether or not the login names anything

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        if self._route is None:
            return False
        fingerprint = fingerprint_sha256(key.public_data)
        user_id = self._route.keys.get(fingerprint)
        if user_id is None:
            return False
        self._signed_in = (user_id, fingerprint)
        return True

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int):
        # The destination the client named is ignored: the login chose the environment.
        return self._forward()

    async def _forward(self):
        assert self._route is not None and self._signed_in is not None
        assert self._connection is not None
        user_id, fingerprint = self._signed_in
        target = await _in_database(
            services.environment_connected,
            environment_id=self._route.environment_id,
            user_id=user_id,
            fingerprint=fingerprint,
        )
        if target is None:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_CONNECT_FAILED,
                "The environment is not running (start it in the console), or you may no "
                "longer use it.",
            )
        if self._activity is None:
            self._activity = asyncio.get_running_loop().create_task(
                self._record_activity(self._route.environment_id)
            )
        return await self._connection.forward_connection(*target)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # no remote forwarding on the gateway itself


def _explain(process: asyncssh.SSHServerProcess) -> None:
    """A shell or command asked of the gateway itself: say how to reach the environment."""
    login = process.get_extra_info("username") or "<environment>.<organisation>"
    process.stderr.write(
        "This is GpuGeek's SSH gateway; it has no shell. Connect through it:\r\n"
        f"  ssh -J {login}@{selectors.gateway_address()} job@{login}\r\n"
    )
    process.exit(1)


async def gateway_start(
    *, host: str, port: int, host_key: asyncssh.SSHKey | None = None
) -> asyncssh.SSHAcceptor:
    """Listen; returns the acceptor (close() it to stop)."""
    return await asyncssh.create_server(
        GatewayServer,
        host,
        port,
        server_host_keys=[host_key or gateway_host_key()],
        process_factory=_explain,
        agent_forwarding=False,
        x11_forwarding=False,
        allow_scp=False,
        sftp_factory=None,
        login_timeout=30,
        keepalive_interval=30,
    )


def gateway_run(*, host: str, port: int) -> None:
    """Serve until the process is stopped (manage.py ssh_gateway)."""

    async def serve() -> None:
        while True:
            try:
                acceptor = await gateway_start(host=host, port=port)
                break
            except OSError as error:
                # Another process holds the port: say so and wait for it, rather than
                # exit (runconsole stops the whole console when a child keeps exiting).
                logger.error("SSH gateway can't listen on %s:%s (%s); retrying", host, port, error)
                await asyncio.sleep(RETRY_SECONDS)
        logger.info("SSH gateway listening on %s:%s", host, port)
        await acceptor.wait_closed()

    asyncio.run(serve())
