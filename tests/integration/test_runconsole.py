"""`manage.py runconsole`, the embedded default, end to end: SQLite and an embedded Redis,
web, worker, beat and watcher as children; SIGTERM stops every one of them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
import websocket

from console.env import embedded_redis_url_file
from console.launcher import free_loopback_port
from tests.integration.helpers import sign_in
from tests.servers import ROOT, wait_until

HEALTHZ_TOKEN = "runconsole-test-token"  # details of /healthz need it

pytestmark = pytest.mark.integration

BACKGROUND_COMPONENTS = ("worker", "beat", "watcher")
# Set by the test session (tests/plugin.py) or CI; the embedded default has none of them.
SESSION_VARIABLES = (
    "REDIS_URL",
    "DATABASE_URL",
    "CELERY_QUEUE",
    "CHANNELS_PREFIX",
    "GPUGEEK_ENV",
    "SECRET_KEY",
    "EMAIL_BACKEND",
    "DJANGO_ALLOW_ASYNC_UNSAFE",
)


def _processes_using(data_dir: Path, redis_address: str | None) -> list[psutil.Process]:
    """Live processes started for this data dir: its path in their argv or environment,
    or, for redis-server (which overwrites both with its title), its address."""
    found = []
    for process in psutil.process_iter(["cmdline", "environ", "status"]):
        if process.pid == os.getpid() or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(process.info["cmdline"] or [])
        environ = process.info["environ"] or {}
        if (
            str(data_dir) in cmdline
            or environ.get("GPUGEEK_DATA_DIR") == str(data_dir)
            or (redis_address and "redis-server" in cmdline and redis_address in cmdline)
        ):
            found.append(process)
    return found


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def _kill_everything(
    launcher: subprocess.Popen,
    known: list[psutil.Process],
    data_dir: Path,
    redis_address: str | None,
):
    """Last resort on failure: nothing this test started may outlive it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(launcher.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        launcher.wait(timeout=5)
    for process in _alive(known) + _processes_using(data_dir, redis_address):
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(process.pid), signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def _healthy(
    base_url: str, launcher: subprocess.Popen, log_path: Path, seen: dict | None = None
) -> dict | None:
    """/healthz's components once the background ones are ok (the last answer in `seen`)."""
    if launcher.poll() is not None:
        log = log_path.read_text()
        raise AssertionError(f"runconsole exited with {launcher.returncode}:\n{log}")
    try:
        response = httpx.get(
            f"{base_url}/healthz", headers={"Authorization": f"Bearer {HEALTHZ_TOKEN}"}, timeout=5
        )
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    components = response.json()["components"]
    if seen is not None:
        seen["components"] = components
    if all(components[name]["status"] == "ok" for name in BACKGROUND_COMPONENTS):
        return components
    return None


def _start_runconsole(tmp_path: Path, **extra_env: str) -> tuple[subprocess.Popen, str, Path, Path]:
    """`manage.py runconsole` in its own session, as `make run` starts it, with its own data
    dir and port: (the launcher, its URL, the data dir, its log)."""
    data_dir = tmp_path / "data"
    port = free_loopback_port()
    env = {k: v for k, v in os.environ.items() if k not in SESSION_VARIABLES}
    env.update(
        GPUGEEK_DATA_DIR=str(data_dir),
        PORT=str(port),
        PYTHONUNBUFFERED="1",
        HEALTHZ_TOKEN=HEALTHZ_TOKEN,
        **extra_env,
    )
    log_path = tmp_path / "runconsole.log"
    with log_path.open("wb") as log_file:
        launcher = subprocess.Popen(
            [sys.executable, "manage.py", "runconsole"],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return launcher, f"http://127.0.0.1:{port}", data_dir, log_path


def test_runconsole_serves_the_console_and_stops_everything_on_sigterm(tmp_path):
    launcher, base_url, data_dir, log_path = _start_runconsole(tmp_path)
    known: list[psutil.Process] = []
    redis_address: str | None = None
    try:
        seen: dict = {}
        try:
            # (Seven processes start at once: on a loaded 2-CPU machine that takes a while.)
            components = wait_until(
                lambda: _healthy(base_url, launcher, log_path, seen),
                90,
                interval=0.5,
                what="runconsole /healthz with worker, beat and watcher ok",
            )
        except AssertionError as error:
            last = seen.get("components")
            log = log_path.read_text()
            raise AssertionError(f"{error}\nlast /healthz: {last}\n{log}") from None
        assert components["database"] == {"status": "ok", "vendor": "sqlite"}
        assert components["redis"]["status"] == "ok"
        redis_url_file = embedded_redis_url_file(data_dir)
        redis_url = urlsplit(redis_url_file.read_text().strip())
        assert redis_url.hostname == "127.0.0.1"
        assert redis_url.port != 6379  # never the system Redis's port
        redis_address = f"{redis_url.hostname}:{redis_url.port}"  # its process title

        # Demo data was seeded on first start: alice signs in and sees her organisation.
        with httpx.Client(base_url=base_url, timeout=10) as client:
            response = sign_in(client, "alice@acme.example", "gpugeek-demo")
            assert response.status_code == 302, response.text
            dashboard = client.get("/")
            assert dashboard.status_code == 200
            assert "Acme" in dashboard.text

        known = psutil.Process(launcher.pid).children(recursive=True)
        known_pids = {process.pid for process in known}
        for name in BACKGROUND_COMPONENTS:
            assert components[name]["pid"] in known_pids, f"{name} is not the launcher's child"
        # redis, web, worker (+ its prefork pool), beat, watcher
        assert len(known) >= 5
        # The leak check below can see them: each has the data dir in its argv or env.
        assert known_pids <= {p.pid for p in _processes_using(data_dir, redis_address)}

        launcher.send_signal(signal.SIGTERM)
        try:
            exit_code = launcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"runconsole did not stop within 30 s:\n{log_path.read_text()}")
        log = log_path.read_text()
        assert exit_code == 0, log
        assert "all processes stopped" in log
        assert not redis_url_file.exists()
        survivors = _alive(known)
        assert not survivors, [(p.pid, p.cmdline()) for p in survivors]
        # Nothing else started for this data dir either (e.g. a grandchild that escaped).
        wait_until(
            lambda: not _processes_using(data_dir, redis_address),
            5,
            what="no process left for this data dir",
        )
    finally:
        _kill_everything(launcher, known, data_dir, redis_address)


def _redis_children(launcher: subprocess.Popen) -> list[psutil.Process]:
    return [
        child
        for child in _alive(psutil.Process(launcher.pid).children())
        if "redis-server" in " ".join(child.cmdline())
    ]


def test_runconsole_restarts_its_embedded_redis_and_the_console_recovers(tmp_path):
    """The embedded Redis dies (SIGKILL): the launcher starts it again on its port with
    its password, /healthz is 200 again, and the console works over it without anyone's
    help: a job launched afterwards is dispatched by the worker, and a status change
    reaches the job's page through the channel layer."""
    launcher, base_url, data_dir, log_path = _start_runconsole(tmp_path, SANDBOX_CLUSTER="0")
    redis_address: str | None = None
    try:
        try:
            wait_until(
                lambda: _healthy(base_url, launcher, log_path),
                45,
                interval=0.5,
                what="runconsole /healthz with worker, beat and watcher ok",
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{log_path.read_text()}") from None
        redis_url = embedded_redis_url_file(data_dir).read_text().strip()
        redis_address = f"127.0.0.1:{urlsplit(redis_url).port}"
        (redis,) = _redis_children(launcher)
        redis.kill()

        def recovered() -> bool:
            started = [child for child in _redis_children(launcher) if child.pid != redis.pid]
            return bool(started) and _healthy(base_url, launcher, log_path) is not None

        try:
            wait_until(recovered, 60, interval=0.5, what="/healthz 200 with a new Redis")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{log_path.read_text()}") from None
        (restarted,) = _redis_children(launcher)
        assert redis_address in " ".join(restarted.cmdline())  # the same port
        assert embedded_redis_url_file(data_dir).read_text().strip() == redis_url
        assert "redis exited with code -9; restarting" in log_path.read_text()

        with httpx.Client(base_url=base_url, timeout=10) as client:
            assert sign_in(client, "alice@acme.example", "gpugeek-demo").status_code == 302
            created = client.post(
                "/api/v1/auth/token",
                json={"email": "alice@acme.example", "password": "gpugeek-demo", "name": "t"},
            )
            assert created.status_code == 201, created.text
            api = {"Authorization": f"Bearer {created.json()['token']}"}
            launched = client.post(
                "/api/v1/jobs",
                headers=api,
                json={
                    "name": "after a Redis restart",
                    "image": "python-3.11",
                    "region": "local",
                    "cpus": 1,
                    "command": ["python", "-c", PRINTS_UNTIL_STOPPED],
                },
            )
            assert launched.status_code == 201, launched.text
            job_id = launched.json()["id"]

            def status() -> str:
                return client.get(f"/api/v1/jobs/{job_id}", headers=api).json()["status"]

            try:  # the worker took the dispatch task from the restarted Redis
                wait_until(lambda: status() == "running", 60, interval=0.5, what="running")
            except AssertionError as error:
                raise AssertionError(f"{error} ({status()})\n{log_path.read_text()}") from None

            socket = websocket.create_connection(
                f"ws://{urlsplit(base_url).netloc}/ws/jobs/{job_id}/",
                timeout=5,
                origin=base_url,
                cookie=f"sessionid={client.cookies['sessionid']}",
            )
            statuses = [_next_status(socket)]
            assert statuses == ["running"]
            cancelled = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api)
            assert cancelled.status_code == 200, cancelled.text

            def page_saw_cancelled() -> bool:
                statuses.append(_next_status(socket))
                return statuses[-1] == "cancelled"

            # Published by the web and the worker through Redis, received by the web's hub.
            wait_until(page_saw_cancelled, 60, interval=0, what="the page's cancelled status")
            socket.close()
    finally:
        _kill_everything(launcher, [], data_dir, redis_address)


# A job that prints until it is cancelled.
PRINTS_UNTIL_STOPPED = (
    "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.2)"
)


def _next_status(socket) -> str:
    """The status of the next status message on a job socket ("" if none came in 5 s)."""
    while True:
        try:
            message = json.loads(socket.recv())
        except websocket.WebSocketTimeoutException:
            return ""
        if message["type"] == "status":
            return message["status"]
