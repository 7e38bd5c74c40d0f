"""Issue 13: a job on the local backend never reaches the console.

Real jobs under the real supervisor: files a job plants are never read as control data,
its environment carries nothing of the console's, a duplicate submit never runs the
command twice, a cancelled job is never started, and with LOCAL_JOB_USER the job can't
open the console's data dir."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.conf import settings

from console.env import embedded_redis_url_file, stored_redis_password, write_private
from jobs import services
from jobs.actors import SYSTEM
from jobs.backends import local_supervisor
from jobs.backends.host_processes import pid_alive
from jobs.backends.local import LocalBackend
from jobs.models import JobStatus
from tests.jobs.test_local_lifecycle import spec, wait_for_status
from tests.jobs_helpers import launch

JOB_USER = "gg-testjob"


def output(job) -> list[str]:
    return [line.text for line in LocalBackend().logs(job)]


def wait_until(predicate, timeout=15, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


PLANT = (
    "import os, pathlib\n"
    "os.mkdir('intent')\n"
    "pathlib.Path('child.pid').write_text('{decoy}')\n"
    "for name, text in (('exit_code', '-40'), ('child.pid', '{decoy}'), ('intent', 'cancel')):\n"
    "    try:\n"
    "        pathlib.Path('..', name).write_text(text)\n"
    "    except OSError as error:\n"
    "        print('could not plant', name, type(error).__name__, flush=True)\n"
    "print('planted in', os.getcwd(), flush=True)\n"
)


@pytest.mark.django_db(transaction=True)
def test_planted_control_files_change_nothing_the_console_believes(world, catalog):
    decoy = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        job = launch(world, spec(["python", "-c", PLANT.format(decoy=decoy.pid)]))
        job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
        assert job.status == JobStatus.SUCCEEDED and job.exit_code == 0, job.status_reason
        backend = LocalBackend()
        workdir, run_dir = backend.workdir(job), backend.run_dir(job)
        assert (workdir / "intent").is_dir()  # the job did plant its files…
        assert not workdir.is_relative_to(run_dir) and workdir.parent != run_dir
        assert run_dir.stat().st_mode & 0o777 == 0o700  # …but never where the console looks
        assert not (run_dir / "intent").exists()
        assert int((run_dir / "child.pid").read_text()) != decoy.pid
        assert (run_dir / "exit_code").read_text() == "0"
        assert any(line.startswith("planted in") for line in output(job))
    finally:
        decoy.kill()
        decoy.wait()


@pytest.mark.django_db(transaction=True)
def test_cancel_after_planting_signals_only_the_real_process(world, catalog, settings):
    settings.JOB_TERMINATION_GRACE_SECONDS = 1
    decoy = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        program = PLANT.format(decoy=decoy.pid) + "import time; time.sleep(60)\n"
        job = launch(world, spec(["python", "-c", program]))
        job = wait_for_status(job, {JobStatus.RUNNING})
        wait_until(lambda: any("planted in" in t for t in output(job)), what="planting")
        backend = LocalBackend()
        child = int((backend.run_dir(job) / "child.pid").read_text())
        assert child != decoy.pid

        services.job_pause(job=job, actor=SYSTEM)
        backend.suspend(job)
        job = wait_for_status(job, {JobStatus.PAUSED})
        assert not pid_alive(child)
        assert decoy.poll() is None  # the planted pid was never signalled
        # Exit code of the real process (SIGTERM, 128 + 15 from the sandbox), not the
        # planted -40.
        assert job.exit_code == 128 + signal.SIGTERM
    finally:
        decoy.kill()
        decoy.wait()


def test_environment_is_built_from_scratch(world, catalog, db, monkeypatch):
    for name, value in {
        "DATABASE_URL": "postgres://console@db/console",
        "REDIS_URL": "redis://:console-password@127.0.0.1:1/0",
        "SECRET_KEY": "console-secret",
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "PYTHONPATH": str(settings.BASE_DIR),
        "GPUGEEK_DATA_DIR": str(settings.DATA_DIR),
        "HOME": "/root",
    }.items():
        monkeypatch.setenv(name, value)
    job = services.job_submit(
        tenant=world.tenant, user=world.member, spec=spec(["python", "-c", "print(1)"])
    )
    backend = LocalBackend()
    env = backend._environment(job, resumed=False)
    for name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"):
        assert name not in env
    assert "PYTHONPATH" not in env and "GPUGEEK_DATA_DIR" not in env
    assert env["HOME"] == "/workspace" and env["TMPDIR"] == "/tmp"  # the sandbox's own
    assert set(env) >= {"PATH", "HOME", "TMPDIR", "GPUGEEK_JOB_ID"}


@pytest.mark.django_db(transaction=True)
def test_a_real_job_sees_neither_console_settings_nor_console_code(world, catalog, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(settings.BASE_DIR))
    monkeypatch.setenv("SECRET_KEY", "console-secret")
    program = (
        "import importlib.util, json, os, sys\n"
        "print(json.dumps({'env': sorted(os.environ), 'path': sys.path, 'cwd': os.getcwd(),"
        " 'console': importlib.util.find_spec('console') is not None}))\n"
    )
    job = wait_for_status(
        launch(world, spec(["python", "-c", program])), {JobStatus.SUCCEEDED, JobStatus.FAILED}
    )
    assert job.status == JobStatus.SUCCEEDED, output(job)
    seen = json.loads(output(job)[0])
    assert not seen["console"]  # the console's code is not importable
    assert not any(p and Path(p).resolve() == settings.BASE_DIR for p in seen["path"])
    assert not {"PYTHONPATH", "SECRET_KEY", "REDIS_URL", "DATABASE_URL"} & set(seen["env"])
    assert seen["cwd"] == "/workspace"  # its work dir, where the sandbox shows it


@pytest.mark.django_db(transaction=True)
def test_duplicate_or_redelivered_submit_of_a_fast_job_runs_it_once(world, catalog):
    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=spec(["python", "-c", "print('ran', flush=True)"]),
    )
    assert job.status == JobStatus.DISPATCHING
    backend = LocalBackend()
    backend.submit(job)  # the first dispatch starts it; the worker dies before recording it
    run_dir = backend.run_dir(job)
    wait_until(lambda: (run_dir / "exit_code").exists(), what="the fast job to end")
    first_child = (run_dir / "child.pid").read_text()
    backend.submit(job)  # a redelivered dispatch task, after the job already ended
    job = services.job_dispatch(job=job)  # and the whole service once more
    job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert job.status == JobStatus.SUCCEEDED
    assert output(job) == ["ran"]
    assert (run_dir / "child.pid").read_text() == first_child


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicate_submits_run_the_command_once(world, catalog):
    import threading

    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=spec(["python", "-c", "print('ran', flush=True)"]),
    )
    backend = LocalBackend()
    threads = [threading.Thread(target=backend.submit, args=(job,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    job = wait_for_status(services.job_dispatch(job=job), {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert output(job) == ["ran"]


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_job_is_never_started(world, catalog, tmp_path):
    marker = tmp_path / "ran"
    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=spec(["python", "-c", f"open({str(marker)!r}, 'w').write('x')"]),
    )
    assert job.status == JobStatus.DISPATCHING
    job = services.job_cancel(job=job, actor=SYSTEM)
    assert job.status == JobStatus.CANCELLED
    backend = LocalBackend()
    backend.cancel(job)  # the cancel task ran first…
    backend.submit(job)  # …then the dispatch that was already under way
    time.sleep(0.5)
    assert not marker.exists()
    assert not (backend.run_dir(job) / "child.pid").exists()
    assert backend.observe(job).phase in ("cancelled", "pending", "missing")


def test_the_supervisor_refuses_a_job_cancelled_before_it_forks(tmp_path):
    """The console's cancel landed between the backend's check and the supervisor's start:
    the supervisor reads the intent under the run directory's lock and starts nothing."""
    run_dir, workdir = tmp_path / "run", tmp_path / "work"
    run_dir.mkdir(mode=0o700)
    workdir.mkdir()
    marker = tmp_path / "ran"
    (run_dir / "intent").write_text("cancel")
    spec_json = {"command": ["touch", str(marker)], "env": {"PATH": os.environ["PATH"]}}
    subprocess.run(
        [sys.executable, "-I", local_supervisor.__file__, str(run_dir), str(workdir)],
        input=json.dumps(spec_json).encode(),
        check=True,
        timeout=10,
    )
    wait_until(lambda: (run_dir / "not_started").exists(), what="the supervisor's refusal")
    time.sleep(0.2)
    assert not marker.exists() and not (run_dir / "child.pid").exists()
    assert "not started" in (run_dir / "output.log").read_text()


def test_output_is_written_by_the_supervisor_not_the_job(tmp_path):
    """The log comes through a pipe: the job has no handle on the file to rewrite."""
    run_dir, workdir = tmp_path / "run", tmp_path / "work"
    run_dir.mkdir(mode=0o700)
    workdir.mkdir()
    program = (
        "import os; print(sorted(os.listdir('/proc/self/fd')), os.readlink('/proc/self/fd/1'))"
    )
    spec_json = {"command": [sys.executable, "-c", program], "env": {}}
    subprocess.run(
        [sys.executable, "-I", local_supervisor.__file__, str(run_dir), str(workdir)],
        input=json.dumps(spec_json).encode(),
        check=True,
        timeout=10,
    )
    wait_until(lambda: (run_dir / "exit_code").exists(), what="the job to end")
    text = (run_dir / "output.log").read_text()
    assert "pipe:" in text and "output.log" not in text


def _job_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("running a job as another OS user needs root (CI runs as root)")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not available to create the throwaway job user")
    try:
        return pwd.getpwnam(JOB_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", JOB_USER],
            check=True,
        )
        return pwd.getpwnam(JOB_USER)


@pytest.fixture
def job_user(settings):
    entry = _job_user()
    work_root = Path(tempfile.mkdtemp(prefix="gpugeek-jobwork-"))
    settings.LOCAL_JOB_SANDBOX = False  # LOCAL_JOB_USER is the no-sandbox fallback
    settings.LOCAL_JOB_USER = JOB_USER
    settings.LOCAL_JOB_WORK_DIR = str(work_root)
    yield entry
    shutil.rmtree(work_root, ignore_errors=True)


READ_EACH = (
    'for f in "$@"; do if cat "$f" >/dev/null 2>&1; then echo "READ $f"; '
    'else echo "DENIED $f"; fi; done; ls "$DATA_DIR_TO_TRY" >/dev/null 2>&1 && echo LISTED; '
    'id -un; echo hello > "$HOME/note"; cat "$HOME/note"'
)


@pytest.mark.django_db(transaction=True)
def test_with_a_job_user_the_job_works_and_cannot_read_the_data_dir(world, catalog, job_user):
    data_dir = Path(settings.DATA_DIR)
    stored_redis_password(data_dir)
    url_file = embedded_redis_url_file(data_dir)
    if not url_file.exists():
        write_private(url_file, os.environ.get("REDIS_URL", "redis://:x@127.0.0.1:1/0"))
    database = Path(settings.DATABASES["default"]["NAME"])
    if not database.is_absolute() or not database.exists():
        database = data_dir / "test-gpugeek.sqlite3"  # PostgreSQL: SQLite's place stands in
        database.touch(mode=0o600)
    targets = [
        data_dir / "secret_key",
        database,
        url_file,
        data_dir / "redis" / "redis-password",
    ]
    assert all(target.exists() for target in targets)
    assert data_dir.stat().st_mode & 0o777 == 0o700
    assert stat.S_IMODE((data_dir / "redis" / "redis-password").stat().st_mode) == 0o600
    job = launch(
        world,
        spec(
            ["/bin/sh", "-c", READ_EACH, "sh", *map(str, targets)],
            env={"DATA_DIR_TO_TRY": str(data_dir)},
        ),
    )
    job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    lines = output(job)
    assert job.status == JobStatus.SUCCEEDED and job.exit_code == 0, lines
    assert [line for line in lines if line.startswith(("READ", "DENIED"))] == [
        f"DENIED {target}" for target in targets
    ]
    assert "LISTED" not in lines
    assert JOB_USER in lines and "hello" in lines  # ran as the job user, in its own HOME
    workdir = LocalBackend().workdir(job)
    assert workdir.stat().st_uid == job_user.pw_uid
    assert (workdir / "note").stat().st_uid == job_user.pw_uid


@pytest.mark.django_db
def test_a_job_whose_supervisor_exits_between_reads_is_not_called_lost(world, catalog, monkeypatch):
    """The supervisor writes exit_code and exits between observe's read of the file and its
    check of the supervisor's pid: the job succeeded, it is not 'missing' (seen on a slow CI)."""
    job = services.job_submit(
        tenant=world.tenant, user=world.member, spec=spec(["python", "-c", "print(1)"])
    )
    backend = LocalBackend()
    run_dir = backend.run_dir(job)
    run_dir.mkdir(parents=True, exist_ok=True)
    ended = subprocess.Popen(["true"])
    ended.wait()  # a pid that no longer runs, for both the child and the supervisor
    (run_dir / "child.pid").write_text(str(ended.pid))
    (run_dir / "supervisor.pid").write_text(str(ended.pid))
    real_alive = pid_alive

    def supervisor_exits_now(pid):
        if pid == ended.pid and not (run_dir / "exit_code").exists():
            (run_dir / "exit_code").write_text("0")
        return real_alive(pid)

    monkeypatch.setattr("jobs.backends.local.pid_alive", supervisor_exits_now)
    observed = backend.observe(job)
    assert (observed.phase, observed.exit_code) == ("succeeded", 0)


@pytest.mark.django_db
def test_a_job_whose_start_is_under_way_is_not_called_lost(world, catalog, monkeypatch):
    """Between the dispatcher writing the run token and the supervisor writing its pid
    (an interpreter starting on a busy host) the job is pending, not lost; a start that
    never got a supervisor is lost once the grace is over."""
    job = services.job_submit(
        tenant=world.tenant, user=world.member, spec=spec(["python", "-c", "print(1)"])
    )
    backend = LocalBackend()
    with backend._locked(job) as run_dir:  # empties what an earlier job of this id left
        (run_dir / "run").write_text("attempt 1 resume 1")
    assert backend.observe(job).phase == "pending"
    monkeypatch.setattr("jobs.backends.local.START_GRACE_SECONDS", 0)
    assert backend.observe(job).phase == "missing"
