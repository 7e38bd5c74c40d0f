"""A job told to stop is billed until its work really ended (issue 26, finding 9).

A cancel of a job whose work may run goes through `cancelling`, which holds its compute
and is metered, until the watcher sees the work gone (the process exited, or was killed
when its grace period ran out); a pause through `pausing` the same way. The local backend
runs real processes here: one ignores SIGTERM, so it runs through its whole grace period.
The ledger is compared with the job's recorded events and the supervisor's exit record,
never with the wall clock.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from billing.metering import meter_tick
from billing.models import JobMeter, UsageRecord
from console.models import Notification
from jobs import services, tasks
from jobs.actors import Actor
from jobs.backends import Observation
from jobs.backends.host_processes import pid_alive
from jobs.backends.local import LocalBackend
from jobs.models import Job, JobStatus
from marketplace.models import NodePool
from tests.jobs.test_local_lifecycle import spec, wait_for_status
from tests.jobs_helpers import advance_to, launch, submit

GRACE = 1  # seconds between SIGTERM and SIGKILL
IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)
# The ledger's quantum: each record's seconds are kept to the millisecond.
RECORD_QUANTUM = 0.001


def wait_until_ready(job: Job) -> None:
    """The program has installed its SIGTERM handler (it prints once it has)."""
    backend = LocalBackend()
    deadline = time.monotonic() + 20
    while [line.text for line in backend.logs(job)][:1] != ["ready"]:
        assert time.monotonic() < deadline, "the job never printed 'ready'"
        time.sleep(0.05)


def billed_seconds(job: Job) -> float:
    records = UsageRecord.objects.filter(job_ref=job.pk)
    return sum((r.interval_end - r.interval_start).total_seconds() for r in records)


def event_at(job: Job, to_status: str) -> datetime:
    return job.events.get(to_status=to_status).at


def process_ended_at(job: Job) -> float:
    """When the supervisor recorded the process's end (it writes exit_code right after
    reaping it)."""
    return (Path(LocalBackend().run_dir(job)) / "exit_code").stat().st_mtime


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("stop", "stopping", "stopped"),
    [
        ("cancel", JobStatus.CANCELLING, JobStatus.CANCELLED),
        ("pause", JobStatus.PAUSING, JobStatus.PAUSED),
    ],
)
def test_a_job_ignoring_sigterm_is_billed_until_its_process_ended(
    world, catalog, settings, stop, stopping, stopped
):
    settings.JOB_TERMINATION_GRACE_SECONDS = GRACE
    job = launch(world, spec(["python", "-c", IGNORES_SIGTERM]))
    wait_until_ready(job)
    child = int((LocalBackend().run_dir(job) / "child.pid").read_text())
    actor = Actor.of_user(world.member)

    if stop == "cancel":
        job = services.job_cancel(job=job, actor=actor)
        tasks.job_cancel_task(job.pk)  # SIGTERM, which the program ignores
    else:
        job = services.job_pause(job=job, actor=actor)
        tasks.job_suspend_task(job.pk)
    assert job.status == stopping
    # A tick while it stops bills it as still running (its meter stays open).
    meter_tick(now=timezone.now())
    assert JobMeter.objects.get(job=job).open
    # A watcher's pass observes first (the process runs on: it stays stopping), then
    # enforces the grace period (SIGKILL once it is over).
    services.jobs_observe(backend_name="local")
    job.refresh_from_db()
    assert job.status == stopping

    # The watcher's passes kill it once its grace period is over, then see it gone.
    job = wait_for_status(job, {stopped}, timeout=30)
    assert not pid_alive(child)
    # It ran until it was killed (a signal's exit code, or 128 + it through the sandbox).
    assert job.exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL)
    meter_tick(now=timezone.now())

    statuses = list(job.events.order_by("at", "pk").values_list("to_status", flat=True))
    assert statuses[-3:] == [JobStatus.RUNNING, stopping, stopped]
    running_at, stop_at, end_at = (event_at(job, s) for s in (JobStatus.RUNNING, stopping, stopped))
    # Its bill ends at the observed end, which follows the process's recorded end and
    # the grace period the process ran through after being told to stop.
    assert end_at.timestamp() >= process_ended_at(job) - 0.01
    assert end_at - stop_at >= timedelta(seconds=GRACE)
    # The ledger holds exactly the time from running to the observed end: the grace
    # included, nothing after.
    expected = (end_at - running_at).total_seconds()
    records = UsageRecord.objects.filter(job_ref=job.pk).count()
    assert abs(billed_seconds(job) - expected) <= RECORD_QUANTUM * records
    assert not JobMeter.objects.get(job=job).open
    meter_tick(now=timezone.now() + timedelta(minutes=1))
    assert abs(billed_seconds(job) - expected) <= RECORD_QUANTUM * records  # nothing more


@pytest.mark.django_db(transaction=True)
def test_a_cancelling_job_holds_its_compute_until_its_process_is_gone(world, catalog, settings):
    """Admission counts a cancelling job's vCPUs as taken: a job waiting for them is
    admitted only once the process is seen gone."""
    settings.JOB_TERMINATION_GRACE_SECONDS = GRACE
    first = launch(world, spec(["python", "-c", IGNORES_SIGTERM], cpus=local_vcpus()))
    wait_until_ready(first)
    waiting = submit(world, "waiting", cpus=local_vcpus())
    assert waiting.status == JobStatus.QUEUED

    first = services.job_cancel(job=first, actor=Actor.of_user(world.member))
    tasks.job_cancel_task(first.pk)
    waiting.refresh_from_db()
    assert (first.status, waiting.status) == (JobStatus.CANCELLING, JobStatus.QUEUED)

    first = wait_for_status(first, {JobStatus.CANCELLED}, timeout=30)
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.DISPATCHING  # admitted once the compute was released
    assert first.events.get(to_status=JobStatus.CANCELLED).at <= waiting.status_changed_at


def local_vcpus() -> int:
    return NodePool.objects.get(backend="local", gpu_type=None, tier="on_demand").allocatable_vcpus


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.DISPATCHING, JobStatus.PAUSED])
def test_a_job_that_runs_nothing_is_cancelled_at_once(world, catalog, status):
    """Queued, dispatching (nothing started yet: a dispatch that started something
    undoes it) or paused: there is no work to wait for, and its compute is free now."""
    submit(world, "filler", cpus=local_vcpus())
    job = submit(world, "idle")
    assert job.status == JobStatus.QUEUED
    if status != JobStatus.QUEUED:
        Job.objects.filter(name="filler").delete()  # room for it
        services.jobs_admit()
        job.refresh_from_db()
        assert job.status == JobStatus.DISPATCHING
        if status != JobStatus.DISPATCHING:
            job = advance_to(job, status)
    job = services.job_cancel(job=job, actor=Actor.of_user(world.member))
    assert job.status == JobStatus.CANCELLED
    assert not job.events.filter(to_status=JobStatus.CANCELLING).exists()


def test_the_reconciler_repeats_a_lost_cancel(world, catalog, django_capture_on_commit_callbacks):
    job = advance_to(submit(world), JobStatus.RUNNING)
    with django_capture_on_commit_callbacks(execute=False):
        job = services.job_cancel(job=job, actor=Actor.of_user(world.member))  # task lost
    later = timezone.now() + timedelta(minutes=5)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.jobs_reconcile(now=later) == [job.pk]
    assert len(callbacks) == 1  # job_cancel_task, queued again
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLING


def test_the_launcher_hears_of_a_colleagues_cancel_once(world, catalog):
    job = advance_to(submit(world), JobStatus.RUNNING)  # the member's
    services.job_cancel(job=job, actor=Actor.of_user(world.admin))
    job.refresh_from_db()
    services.job_apply_observation(job=job, observation=Observation(phase="cancelled"))
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert job.status_reason == "cancelled by user; compute released"
    notes = Notification.objects.filter(user=world.member)
    assert list(notes.values_list("title", flat=True)) == [f"{job.name} was cancelled"]

    mine = advance_to(submit(world, "mine"), JobStatus.RUNNING)
    services.job_cancel(job=mine, actor=Actor.of_user(world.member))  # their own: no note
    mine.refresh_from_db()
    services.job_apply_observation(job=mine, observation=Observation(phase="cancelled"))
    assert Notification.objects.filter(user=world.member).count() == 1
