"""Real processes for integration and browser tests: an ASGI server and a Celery worker.

They run against the test database (a file for SQLite, `test_…` on Postgres), so tests
using them need `transactional_db` (committed data is visible across processes).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.utils.module_loading import import_string

from console.celery import app as celery_app
from console.launcher import asgi_server_argv, free_loopback_port

ROOT = Path(__file__).resolve().parent.parent
ASGI_APP = "console.asgi:application"


def test_database_url() -> str:
    """The URL of the database this test session uses, for child processes."""
    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{params['NAME']}"
    if connection.vendor == "postgresql":
        user = quote(params.get("USER") or "")
        password = quote(params.get("PASSWORD") or "")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = params.get("HOST") or "127.0.0.1"
        port = params.get("PORT") or 5432
        return f"postgres://{auth}{host}:{port}/{params['NAME']}"
    raise RuntimeError(f"unsupported test database vendor {connection.vendor}")


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=test_database_url(),
        REDIS_URL=settings.REDIS_URL,
        GPUGEEK_DATA_DIR=str(settings.DATA_DIR),
        DJANGO_SETTINGS_MODULE="console.settings",
        PYTHONUNBUFFERED="1",
    )
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    # Importing console.asgi here (websocket tests) turns the pool on for this process
    # only: a web child turns it on for itself; a worker child must not inherit it.
    env.pop("DATABASE_POOL", None)
    env.update(extra)
    return env


def stop_process_group(process: subprocess.Popen, timeout: float = 15) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)
    except ProcessLookupError:
        pass


def wait_until(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class AsgiServer:
    def __init__(self, process: subprocess.Popen, port: int, log_path: Path):
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}"
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def served(name: str, argv: list[str], port: int, log_path: Path) -> Iterator[AsgiServer]:
    """An ASGI server (`argv`) listening on `port`, stopped afterwards."""
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=child_env(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = AsgiServer(process, port, log_path)
    try:
        wait_until(lambda: process.poll() is not None or _port_open(port), 30, what=name)
        if process.poll() is not None:
            raise AssertionError(f"{name} exited early:\n{server.log()}")
        yield server
    finally:
        stop_process_group(process)


@pytest.fixture
def asgi_server(transactional_db, tmp_path) -> Iterator[AsgiServer]:
    """uvicorn serving console.asgi on a free loopback port, against the test database,
    as `runconsole` runs it."""
    port = free_loopback_port()
    argv = asgi_server_argv("127.0.0.1", port)
    with served("uvicorn", argv, port, tmp_path / "uvicorn.log") as server:
        yield server


class CeleryWorker:
    def __init__(self, process: subprocess.Popen, log_path: Path):
        self.process = process
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def purge_queues() -> None:
    """Drop the tasks earlier tests queued and nobody ran, and a dispatch sweep's "queued"
    mark: left, it would keep this test's launches from queueing their sweep."""
    from django.core.cache import cache

    celery_app.control.purge()
    # (By name: this module is imported by the fork server before Django is set up.)
    cache.delete(import_string("jobs.services.dispatch.SWEEP_QUEUED_KEY"))


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path) -> Iterator[CeleryWorker]:
    """A real `celery worker` process (solo pool) consuming from the test Redis."""
    # Unit tests before this one may have queued e-mails: start from an empty queue.
    purge_queues()
    log_path = tmp_path / "worker.log"
    mail_dir = tmp_path / "mail"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "console",
                "worker",
                "-l",
                "INFO",
                "--pool",
                "solo",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"test-{os.getpid()}@%h",
            ],
            cwd=ROOT,
            env=child_env(
                EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
                EMAIL_FILE_PATH=str(mail_dir),
            ),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = CeleryWorker(process, log_path)
    worker.mail_dir = mail_dir
    try:
        wait_until(
            lambda: process.poll() is not None or " ready." in worker.log(),
            60,
            what="celery worker ready",
        )
        if process.poll() is not None:
            raise AssertionError(f"celery worker exited early:\n{worker.log()}")
        yield worker
    finally:
        stop_process_group(process)


def http_get(url: str, **kwargs) -> httpx.Response:
    return httpx.get(url, timeout=10, **kwargs)


class ChildProcess:
    """A console process a test started, with its combined output in a log file."""

    def __init__(self, process: subprocess.Popen, log_path: Path):
        self.process = process
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


Watcher = CeleryBeat = ChildProcess


@contextmanager
def started_child(argv: list[str], env: dict, log_path: Path, ready: str, what: str):
    """Start `argv` in its own process group, wait until its log says `ready`, and stop
    the whole group afterwards."""
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    child = ChildProcess(process, log_path)
    try:
        wait_until(lambda: process.poll() is not None or ready in child.log(), 30, what=what)
        if process.poll() is not None:
            raise AssertionError(f"{what}: exited early:\n{child.log()}")
        yield child
    finally:
        stop_process_group(process)


@pytest.fixture
def watcher_process(transactional_db, tmp_path) -> Iterator[ChildProcess]:
    """`manage.py run_watcher` observing the local backend every second, against the test
    database; it sees the jobs' files through the shared GPUGEEK_DATA_DIR."""
    with started_child(
        [sys.executable, "manage.py", "run_watcher"],
        child_env(WATCHER_INTERVAL="1"),
        tmp_path / "watcher.log",
        ready="watcher started",
        what="watcher started",
    ) as watcher:
        yield watcher


@pytest.fixture
def celery_beat_process(transactional_db, tmp_path) -> Iterator[ChildProcess]:
    """`celery beat` (the console's database scheduler) sending the periodic tasks to the
    test queue, as in production. Intervals come from the environment the test sets
    (e.g. METRICS_INTERVAL, METERING_INTERVAL), read by beat at start."""
    with started_child(
        [sys.executable, "-m", "celery", "-A", "console", "beat", "-l", "INFO", "--pidfile="],
        child_env(),
        tmp_path / "beat.log",
        ready="beat: Starting",
        what="celery beat started",
    ) as beat:
        yield beat
