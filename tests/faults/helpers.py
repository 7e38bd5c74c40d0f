"""What the fault-injection tests share: the one line of counts each prints, a Redis of
the test's own that it may kill and restart, Celery workers killed and replaced at will,
and a tally of the requests and Job creates the simulated Kubernetes API server saw."""

from __future__ import annotations

import importlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import traceback
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import django
import redis
from django.conf import settings
from django.db import connections
from kombu.transport.redis import PRIORITY_STEPS
from kombu.transport.redis import Channel as RedisChannel

from console.celery import app as celery_app
from console.launcher import (
    free_loopback_port,
    redis_server_argv,
    redis_server_config,
    redis_url,
    wait_for_redis,
)
from sandbox.kubesim import KubeAPIServer
from tests.integration.helpers import WorkerProcess, celery_worker_argv, start_worker_process
from tests.servers import ROOT, child_env, stop_process_group, wait_until

# The lines printed so far this session; tests/faults/conftest.py repeats them in the
# terminal summary, so CI's log shows them without `-s`.
REPORTED: list[str] = []


def report_counts(name: str, **counts: object) -> str:
    """Print `FAULTS <name>: key=value …` (and keep it for the terminal summary)."""
    line = f"FAULTS {name}: " + " ".join(
        f"{key}={value:.1f}" if isinstance(value, float) else f"{key}={value}"
        for key, value in counts.items()
    )
    print(line, flush=True)
    REPORTED.append(line)
    return line


# --- Redis ----------------------------------------------------------------------------------


class OwnRedis:
    """A redis-server of this test alone, on a free loopback port, with nothing persisted
    (`save ""`, no AOF): killing it loses every message in it, as a Redis restart without
    persistence does. Restarted on the same port and password, so clients reconnect to it.

    Never the shared Redis: other sessions' queues live there."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_loopback_port()
        self.password = secrets.token_urlsafe(16)
        self.url = redis_url(port=self.port, password=self.password)
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None
        self.starts += 1
        self.process = subprocess.Popen(
            redis_server_argv(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        config = redis_server_config(
            port=self.port,
            directory=self.directory,
            password=self.password,
            logfile=self.directory / f"redis-{self.starts}.log",
        )
        self.process.stdin.write(config.encode())
        self.process.stdin.close()
        wait_for_redis("127.0.0.1", self.port, self.password)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, connections cut mid-command."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5)


@contextmanager
def celery_broker(url: str) -> Iterator[None]:
    """Point this process's Celery app (what `console.queueing` sends with) at `url`,
    then back as it was. Its connection and producer pools, made for the broker it used
    so far, are dropped, so that the next send connects anew."""

    def drop_pools() -> None:
        celery_app._pool = None
        with suppress(KeyError):
            celery_app.__dict__["amqp"]._producer_pool = None

    # The app's configuration reads through to the settings; what is set on it is kept
    # in its `changes`, which are put back exactly (not left pinned to `url`). Configured
    # first: run alone, the app would load its configuration at its first send, after
    # this, and drop what is set here.
    celery_app.loader.import_default_modules()
    changes = celery_app.conf.changes
    had_own, own = "broker_url" in changes, changes.get("broker_url")
    changes["broker_url"] = url
    drop_pools()
    try:
        yield
    finally:
        if had_own:
            changes["broker_url"] = own
        else:
            changes.pop("broker_url", None)
        drop_pools()


def queue_length(client: redis.Redis, queue: str) -> int:
    """Messages waiting in a kombu Redis queue: its list, and one per priority step."""
    priority_lists = [f"{queue}{RedisChannel.sep}{step}" for step in PRIORITY_STEPS if step]
    return sum(client.llen(key) for key in (queue, *priority_lists))


# --- Celery workers -------------------------------------------------------------------------


class WorkerForkServer:
    """Starts Celery workers by forking a process that has already imported Django, the
    Celery app and every task module, rather than a new interpreter each time (over a
    second of CPU on these machines, which would make fifty kills take minutes). Each
    fork leaves the server's session (setsid) and runs the `celery worker` entry point
    with production's arguments, so what a test kills is a real prefork worker leading
    its own process group, from the same code; only the imports before the fork are
    shared. The server holds no database or broker connection when it forks."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.log_path = directory / "fork-server.log"
        with self.log_path.open("wb") as log_file:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from tests.faults.helpers import fork_server; fork_server()",
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                start_new_session=True,
                text=True,
            )
        if self.process.stdout.readline().strip() != "ready":
            raise AssertionError(f"fork server failed:\n{self.log_path.read_text()}")

    def start(self, name: str, log_path: Path) -> WorkerProcess:
        self.process.stdin.write(f"{name}\t{log_path}\n")
        self.process.stdin.flush()
        return WorkerProcess(int(self.process.stdout.readline()), log_path)

    def stop(self) -> None:
        with suppress(OSError):
            self.process.stdin.close()
        stop_process_group(self.process, timeout=5)


# Imported before forking too: the worker itself, its broker transport, and the
# Kubernetes backend (which `get_backend` imports on first use: over a second of CPU here,
# in which nearly every kill of a fresh worker would land).
PRELOADED = (
    "celery.apps.worker",
    "celery.concurrency.prefork",
    "kombu.transport.redis",
    "jobs.backends.kubernetes",
)


def fork_server() -> None:
    """The fork server's main loop (run with `python -c`): one line `<name>\t<log path>`
    in, the new worker's pid out."""
    django.setup()
    celery_app.loader.import_default_modules()  # what the worker's autodiscovery imports
    for module in PRELOADED:
        importlib.import_module(module)
    connections.close_all()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the workers are reaped at once
    print("ready", flush=True)
    for line in iter(sys.stdin.readline, ""):
        name, log_path = line.rstrip("\n").split("\t")
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pid = os.fork()
        if pid == 0:  # the worker; it never returns to the loop
            status = 1
            try:
                os.setsid()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                null_fd = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null_fd, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                celery_app.worker_main(celery_worker_argv(name))
                status = 0
            except SystemExit as stop:
                status = 0 if stop.code in (None, 0) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        os.close(log_fd)
        print(pid, flush=True)


class Workers:
    """Real prefork Celery workers (concurrency 1, each leading its own process group)
    that a test starts without waiting and SIGKILLs whole at any moment; `forked`
    starts them through a `WorkerForkServer`."""

    def __init__(self, directory: Path, *, forked: bool = False, **env: str) -> None:
        self.directory = directory
        self.env = child_env(**env)
        self.fork_server = WorkerForkServer(directory, self.env) if forked else None
        self.started: list[WorkerProcess] = []
        self.killed: list[WorkerProcess] = []

    def start(self) -> WorkerProcess:
        number = len(self.started) + 1
        name = f"faults-{number}-{os.getpid()}"
        log_path = self.directory / f"worker-{number}.log"
        if self.fork_server is not None:
            worker = self.fork_server.start(name, log_path)
        else:
            worker = start_worker_process(name, log_path, self.env)
        self.started.append(worker)
        return worker

    def start_ready(self, timeout: float = 60) -> WorkerProcess:
        worker = self.start()
        wait_until(lambda: worker.exited() or worker.ready(), timeout, 0.05, "worker ready")
        if worker.exited():
            raise AssertionError(f"celery worker exited early:\n{worker.log()}")
        return worker

    @property
    def live(self) -> list[WorkerProcess]:
        return [w for w in self.started if w not in self.killed]

    def kill(self, worker: WorkerProcess) -> None:
        worker.kill_group()
        self.killed.append(worker)

    def stop_all(self) -> None:
        for worker in self.live:  # signal every group first, then reap each
            worker.signal_group()
        for worker in self.live:
            self.kill(worker)
        if self.fork_server is not None:
            self.fork_server.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path.name}\n{w.log()[-3000:]}" for w in self.started)


def worker_env(**extra: str) -> dict[str, str]:
    """What a dispatching worker needs beyond `child_env`: the Kubernetes backend at the
    kubeconfig the test set, with `extra` (e.g. a short visibility timeout)."""
    return {
        "COMPUTE_BACKENDS": "kubernetes",
        "KUBECONFIG": str(settings.KUBECONFIG),
        "KUBERNETES_REQUEST_TIMEOUT": "20",
        **extra,
    }


# --- the simulated cluster -----------------------------------------------------------------


class ApiTally:
    """What the simulated API server saw, counted as it happened: every request as it
    arrives (before any fault holds it), and every batch/v1 Job created, by (namespace,
    name). A name created twice is a Job deleted and made again, as one delivery too many
    would do it (the server itself answers a second create of a name with 409)."""

    def __init__(self, server: KubeAPIServer) -> None:
        self.requests = 0
        self._lock = threading.Lock()
        self.uids: dict[tuple[str, str], list[str]] = defaultdict(list)
        create, arrive = server._create, server._inject_fault

        def counting_create(rt, ns, obj, *args, **kwargs):
            created = create(rt, ns, obj, *args, **kwargs)
            if rt.plural == "jobs" and rt.group == "batch" and not kwargs.get("dry_run"):
                meta = created["metadata"]
                self.uids[(meta["namespace"], meta["name"])].append(meta["uid"])
            return created

        def counting_arrival(method: str, path: str) -> None:
            with self._lock:  # each request on its own HTTP thread
                self.requests += 1
            arrive(method, path)

        server._create = counting_create
        server._inject_fault = counting_arrival

    def job_creates(self) -> dict[str, int]:
        """Job name → how many times a Job of that name was created."""
        return {name: len(uids) for (_, name), uids in self.uids.items()}
