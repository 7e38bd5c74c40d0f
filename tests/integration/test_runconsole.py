"""`manage.py runconsole`, the embedded default, end to end: SQLite and an embedded Redis,
web, worker, beat and watcher as children; SIGTERM stops every one of them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

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


def _healthy(base_url: str, launcher: subprocess.Popen, log_path: Path) -> dict | None:
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
    if all(components[name]["status"] == "ok" for name in BACKGROUND_COMPONENTS):
        return components
    return None


def test_runconsole_serves_the_console_and_stops_everything_on_sigterm(tmp_path):
    data_dir = tmp_path / "data"
    port = free_loopback_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in SESSION_VARIABLES}
    env.update(
        GPUGEEK_DATA_DIR=str(data_dir),
        PORT=str(port),
        PYTHONUNBUFFERED="1",
        HEALTHZ_TOKEN=HEALTHZ_TOKEN,
    )
    log_path = tmp_path / "runconsole.log"
    known: list[psutil.Process] = []
    redis_address: str | None = None
    with log_path.open("wb") as log_file:
        launcher = subprocess.Popen(
            [sys.executable, "manage.py", "runconsole"],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        try:
            components = wait_until(
                lambda: _healthy(base_url, launcher, log_path),
                45,
                interval=0.5,
                what="runconsole /healthz with worker, beat and watcher ok",
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{log_path.read_text()}") from None
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
