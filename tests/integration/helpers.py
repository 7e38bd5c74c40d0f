"""Shared steps of the integration tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import redis
from kombu.utils.json import loads

from tests.servers import ROOT, wait_until


def sign_in(client: httpx.Client, email: str, password: str) -> httpx.Response:
    """Sign in through the real form, CSRF included, as a browser would.

    Returns the POST's response (302 to the dashboard when it worked); the client keeps
    the session cookie.
    """
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    csrf_token = client.cookies.get("csrftoken")
    assert csrf_token, "the sign-in page set no csrftoken cookie"
    return client.post(
        "/accounts/login/",
        data={"username": email, "password": password, "csrfmiddlewaretoken": csrf_token},
    )


# --- Celery worker processes that tests kill (tests/integration/test_dispatch_exactly_once.py,
# tests/faults/) --------------------------------------------------------------------------------


# The one dispatch task: a sweep over the admitted jobs' rows.
DISPATCH_TASK = r"jobs\.tasks\.jobs_dispatch_task"
DISPATCH_RECEIVED = re.compile(rf"Task {DISPATCH_TASK}\[([0-9a-f-]+)\] received")


@dataclass(eq=False)  # one per process: compared and hashed by identity
class WorkerProcess:
    """A `celery worker` leading its own process group, so that the group can be
    SIGKILLed whole: prefork children would otherwise outlive their parent.

    `process` is None for a worker forked by a fork server (tests/faults/helpers.py),
    which reaps it."""

    pid: int
    log_path: Path
    process: subprocess.Popen | None = None

    @property
    def pgid(self) -> int:
        return self.pid  # it leads its own group (setsid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        return " ready." in self.log()

    def exited(self) -> bool:
        if self.process is not None:
            return self.process.poll() is not None
        try:
            return psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def received(self) -> list[str]:
        """Ids of the dispatch tasks this worker has received, in order."""
        return DISPATCH_RECEIVED.findall(self.log())

    def kill_group(self) -> None:
        """SIGKILL the whole group: the main process and its prefork children, as when a
        node dies or the OOM killer strikes; returns once none of them is left."""
        self.signal_group()
        if self.process is not None:
            self.process.wait(timeout=10)
        wait_until(
            lambda: not group_alive(self.pgid), 10, 0.02, what=f"process group {self.pgid} gone"
        )

    def signal_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in the group."""
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return False


def celery_worker_argv(name: str) -> list[str]:
    """`celery worker`'s arguments (after `celery -A console`): prefork, concurrency 1, as
    in production."""
    return [
        "worker", "-l", "INFO", "--pool", "prefork", "--concurrency", "1",
        "--without-gossip", "--without-mingle", "-n", f"{name}@%h",
    ]  # fmt: skip


def start_worker_process(name: str, log_path: Path, env: dict[str, str]) -> WorkerProcess:
    """Start a Celery worker (`celery_worker_argv`) in its own session without waiting
    for it: see `WorkerProcess.ready()`."""
    command = [sys.executable, "-m", "celery", "-A", "console", *celery_worker_argv(name)]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return WorkerProcess(process.pid, log_path, process)


def unacked_tags(client: redis.Redis, queue: str) -> list[bytes]:
    """Delivery tags of `queue`'s messages handed to a worker and not acknowledged yet
    (kombu's Redis transport keeps them until the visibility timeout gives them back)."""
    tags = []
    for tag, raw in client.hgetall("unacked").items():
        _message, exchange, routing_key = loads(raw)
        if queue in (exchange, routing_key):
            tags.append(tag)
    return tags


def forget_abandoned_messages(queue: str, redis_url: str) -> None:
    """Drop the unacknowledged messages of `queue` that killed workers left in Redis, so no
    later test's worker is handed a stale task (other queues' entries are left alone)."""
    client = redis.Redis.from_url(redis_url)
    try:
        for tag in unacked_tags(client, queue):
            client.pipeline().hdel("unacked", tag).zrem("unacked_index", tag).execute()
    finally:
        client.close()
