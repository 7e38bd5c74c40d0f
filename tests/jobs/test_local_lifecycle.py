"""The local backend runs real commands under its supervisor; the watcher's pass
(jobs_observe) maps what it sees onto the state machine."""

from __future__ import annotations

import sys
import time

import pytest
from django.urls import reverse

from jobs import services
from jobs.actors import SYSTEM
from jobs.backends.host_processes import pid_alive
from jobs.backends.local import LocalBackend
from jobs.models import Job, JobStatus
from jobs.services import JobSpec
from tests.conftest import signed_in_client
from tests.jobs_helpers import launch


def spec(command, **overrides):
    values = {"name": "local test", "image": "python-3.11", "command": command, "cpus": 1}
    values.update(overrides)
    return JobSpec(**values)


def wait_for_status(job, statuses, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        services.jobs_observe(backend_name="local")
        job.refresh_from_db()
        if job.status in statuses:
            return job
        time.sleep(0.1)
    log_path = LocalBackend().log_path(job)
    output = log_path.read_text() if log_path.exists() else ""
    raise AssertionError(f"job stayed {job.status} ({job.status_reason}); log: {output}")


@pytest.mark.django_db(transaction=True)
def test_command_runs_prints_and_succeeds(world, catalog):
    job = launch(
        world,
        spec(["python", "-c", "import os; print('hello from', os.environ['GPUGEEK_JOB_ID'])"]),
    )
    job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert job.status == JobStatus.SUCCEEDED and job.exit_code == 0
    lines = LocalBackend().logs(job)
    assert lines[0].text == f"hello from {job.pk}"
    assert [e.to_status for e in job.events.all()] == [
        "queued",
        "dispatching",
        "running",
        "succeeded",
    ]


@pytest.mark.django_db(transaction=True)
def test_exit_code_maps_to_failed_with_reason(world, catalog):
    job = launch(world, spec(["python", "-c", "import sys; sys.exit(3)"]))
    job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert job.status == JobStatus.FAILED and job.exit_code == 3
    assert "exit code 3" in job.status_reason


@pytest.mark.django_db(transaction=True)
def test_shell_metacharacters_are_argv_not_shell(world, catalog, tmp_path):
    marker = tmp_path / "pwned"
    job = launch(
        world,
        spec(
            ["python", "-c", "import sys; print(sys.argv[1:])", f"; touch {marker}", "$(touch x)"]
        ),
    )
    job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert job.status == JobStatus.SUCCEEDED
    assert not marker.exists()
    assert "$(touch x)" in LocalBackend().logs(job)[0].text


@pytest.mark.django_db(transaction=True)
def test_pause_resume_cancel_leave_no_process(world, catalog, settings):
    settings.JOB_TERMINATION_GRACE_SECONDS = 1
    program = (
        "import os, signal, sys, time\n"
        "print('resumed' if os.environ['GPUGEEK_RESUMED'] == '1' else 'fresh', flush=True)\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('checkpoint', flush=True), sys.exit(0)))\n"
        "time.sleep(60)\n"
    )
    job = launch(world, spec(["python", "-c", program]))
    backend = LocalBackend()
    job = wait_for_status(job, {JobStatus.RUNNING})
    time.sleep(0.5)

    job = services.job_pause(job=job, actor=SYSTEM)
    assert job.status == JobStatus.PAUSING
    backend.suspend(job)  # what job_suspend_task does
    job = wait_for_status(job, {JobStatus.PAUSED})
    assert services.job_pause(job=job, actor=SYSTEM).status == JobStatus.PAUSED  # idempotent

    job = services.job_resume(job=job, actor=SYSTEM)
    services.job_backend_resume(job=job)  # what job_resume_task does
    job = wait_for_status(job, {JobStatus.RUNNING})
    time.sleep(0.5)
    texts = [line.text for line in backend.logs(job)]
    assert texts[:3] == ["fresh", "checkpoint", "resumed"], texts

    child = int((backend.run_dir(job) / "child.pid").read_text())
    job = services.job_cancel(job=job, actor=SYSTEM)
    backend.cancel(job)
    assert job.status == JobStatus.CANCELLING
    job = wait_for_status(job, {JobStatus.CANCELLED})
    assert not pid_alive(child)
    with pytest.raises(services.ActionRefused):
        services.job_resume(job=job, actor=SYSTEM)


@pytest.mark.django_db(transaction=True)
def test_max_runtime_fails_the_job_with_reason(world, catalog):
    job = launch(
        world, spec(["python", "-c", "import time; time.sleep(60)"], max_runtime_minutes=1)
    )
    job = wait_for_status(job, {JobStatus.RUNNING})
    # Max runtime counts running time: as if it had been running for two minutes.
    Job.objects.filter(pk=job.pk).update(run_seconds=120)
    job = wait_for_status(job, {JobStatus.FAILED})
    assert "maximum runtime" in job.status_reason


@pytest.mark.django_db(transaction=True)
def test_lost_process_is_marked_failed(world, catalog):
    import os
    import signal as sig

    job = launch(world, spec(["python", "-c", "import time; time.sleep(60)"]))
    job = wait_for_status(job, {JobStatus.RUNNING})
    backend = LocalBackend()
    supervisor = int((backend.run_dir(job) / "supervisor.pid").read_text())
    child = int((backend.run_dir(job) / "child.pid").read_text())
    os.kill(supervisor, sig.SIGKILL)
    os.killpg(child, sig.SIGKILL)
    job = wait_for_status(job, {JobStatus.FAILED})
    assert job.status_reason.startswith("lost") or "SIGKILL" in job.status_reason


@pytest.mark.django_db(transaction=True)
def test_python_is_the_hosts_python3_in_the_sandbox(world, catalog):
    job = launch(world, spec(["python", "-c", "import sys; print(sys.version_info[0])"]))
    job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert job.status == JobStatus.SUCCEEDED, job.status_reason
    assert [line.text for line in LocalBackend().logs(job)] == ["3"]
    env = LocalBackend()._environment(job, resumed=False)
    assert env["PATH"].split(":")[0] == "/opt/gpugeek/bin"  # `python` is python3 there


def test_without_a_sandbox_python_is_the_console_interpreter(world, catalog, db, settings):
    settings.LOCAL_JOB_SANDBOX = False
    job = services.job_submit(
        tenant=world.tenant, user=world.member, spec=spec(["python", "-c", "print(1)"])
    )
    env = LocalBackend()._environment(job, resumed=False)
    assert env["PATH"].split(":")[0] == str(__import__("pathlib").Path(sys.executable).parent)


@pytest.mark.django_db(transaction=True)
def test_a_failed_jobs_page_shows_what_it_printed_last(world, catalog):
    code = "import sys; print('loading'); sys.exit('ValueError: bad learning rate -1')"
    job = launch(world, spec(["python", "-c", code]))
    job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert job.status == JobStatus.FAILED

    page = signed_in_client(world.member, world.tenant).get(reverse("jobs:detail", args=[job.pk]))

    tail = page.content.decode().split('data-testid="failure-tail"', 1)[1].split("</pre>", 1)[0]
    assert "loading" in tail and "ValueError: bad learning rate -1" in tail
    ok = launch(world, spec(["python", "-c", "print('fine')"]))
    wait_for_status(ok, {JobStatus.SUCCEEDED})
    page = signed_in_client(world.member, world.tenant).get(reverse("jobs:detail", args=[ok.pk]))
    assert 'data-testid="failure-tail"' not in page.content.decode()
