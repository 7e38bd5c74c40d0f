"""Issue 13 §2: one job cannot stop or starve the others. Watcher isolation, dispatch
failures counted and bounded, cancel during dispatch, the reconciler redoing lost tasks,
max runtime counting running time only, GPU assignment locked on PostgreSQL.

Real local jobs and the real services; the only edge replaced is the broker (tasks are
recorded, as a broker outage at commit would drop them, and run here later)."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import psutil
import pytest
from celery import Task
from django.db import connection
from django.utils import timezone

from console.celery import app as celery_app
from jobs import services
from jobs.actors import SYSTEM
from jobs.backends import local as local_backend
from jobs.backends.local import LocalBackend
from jobs.models import Job, JobStatus
from jobs.state import job_transition
from marketplace.services import capacity_sync
from tests.broker import broker_replaced
from tests.concurrency import run_at_once
from tests.jobs.test_local_lifecycle import spec, wait_for_status
from tests.jobs_helpers import launch

SLEEP = ["python", "-c", "import time; time.sleep(60)"]


class DroppedTasks:
    """The broker during an outage: every task sent is refused (console.queueing says
    False) and recorded, with its countdown, so the test can play the worker later."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple, float | None]] = []
        self.lock = threading.Lock()

    def send(self, task: Task, args: tuple, countdown: float | None) -> None:
        with self.lock:
            self.sent.append((task.name, args, countdown))
        raise ConnectionError("the broker is down (test)")

    def run(self, task_name: str | None = None) -> list[tuple[str, tuple, float | None]]:
        """Run (and forget) the recorded tasks, or those named `task_name`."""
        with self.lock:
            chosen = [t for t in self.sent if task_name is None or t[0] == task_name]
            self.sent = [t for t in self.sent if t not in chosen]
        for name, args, _ in chosen:
            celery_app.tasks[name].apply(args=args, throw=True)
        return chosen

    def names(self, job_id: int) -> list[str]:
        """The tasks sent for the job: its own, and sweeps (they take every due job)."""
        return [name for name, args, _ in self.sent if args in ((job_id,), ())]


@pytest.fixture
def dropped(monkeypatch) -> DroppedTasks:
    recorder = DroppedTasks()
    broker_replaced(monkeypatch, recorder.send)
    return recorder


def alive_processes(job: Job) -> list[int]:
    """The job's supervisor and command processes that still run (zombies don't)."""
    run_dir = LocalBackend().data_dir / "jobs" / str(job.pk)
    pids = []
    for name in ("child.pid", "supervisor.pid"):
        try:
            pid = int((run_dir / name).read_text())
        except (OSError, ValueError):
            continue
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                pids.append(pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def settle(jobs: list[Job], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        services.jobs_observe(backend_name="local")
        stopping = Job.objects.filter(pk__in=[job.pk for job in jobs], status=JobStatus.CANCELLING)
        # Processes gone, and seen gone (a cancelling job is cancelled once observed).
        if not any(alive_processes(job) for job in jobs) and not stopping.exists():
            return
        time.sleep(0.1)


# --- 1. watcher isolation ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_job_killed_by_a_realtime_signal_does_not_stop_the_pass(world, catalog):
    """Signal 40 (SIGRTMIN+6) has no name in Python's Signals enum: mapping it used to
    raise inside the pass, and every job after it was never observed again."""
    killed = launch(world, spec(["python", "-c", "import os; os.kill(os.getpid(), 40)"]))
    normal = launch(world, spec(["python", "-c", "print('fine')"]))
    normal = wait_for_status(normal, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert normal.status == JobStatus.SUCCEEDED
    killed = wait_for_status(killed, {JobStatus.FAILED, JobStatus.SUCCEEDED})
    # The sandbox reports a signal's death as 128 + its number, as shells do.
    assert killed.status == JobStatus.FAILED and killed.exit_code == 128 + 40
    assert "signal 40" in killed.status_reason


# --- 4. DISPATCH_MAX_ATTEMPTS ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_unexpected_dispatch_error_is_retried_then_fails_the_job(
    world, catalog, settings, dropped
):
    """Junk in the data dir (a file where the job's run directory goes) makes every
    submit raise an unexpected error: it is counted and retried, and at the limit the job
    fails with the reason instead of holding its capacity for ever."""
    settings.DISPATCH_MAX_ATTEMPTS = 3
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=spec(SLEEP))
    assert job.status == JobStatus.DISPATCHING
    junk = LocalBackend().data_dir / "jobs" / str(job.pk)
    junk.parent.mkdir(parents=True, exist_ok=True)
    junk.write_text("not a directory")
    try:
        for attempt, wait in ((1, 2), (2, 4)):
            dropped.sent.clear()
            job = services.job_dispatch(job=job)
            assert job.status == JobStatus.DISPATCHING and job.dispatch_failures == attempt
            assert f"({attempt}/3)" in job.status_reason
            # Put off with a doubling wait: a sweep is queued for then, none takes it now.
            assert dropped.sent == [("jobs.tasks.jobs_dispatch_task", (), wait)]
            assert job.dispatch_after > timezone.now() + timedelta(seconds=wait - 1)
            assert services.jobs_dispatch_pending() == 0
        job = services.job_dispatch(job=job)
        assert job.status == JobStatus.FAILED and job.dispatch_failures == 3
        assert "dispatch failed 3 times" in job.status_reason
        assert not Job.objects.filter(pk=job.pk).holding_compute().exists()
    finally:
        junk.unlink()


# --- 5. cancel during dispatch -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_dispatch_leaves_nothing_running(world, catalog, dropped):
    rng = random.Random(13)
    jobs = []
    for _ in range(20):
        job = services.job_submit(tenant=world.tenant, user=world.member, spec=spec(SLEEP))
        assert job.status == JobStatus.DISPATCHING, job.status_reason
        delay = rng.uniform(0, 0.3)

        def dispatch(job_id=job.pk):
            try:
                services.job_dispatch(job=Job.objects.get(pk=job_id))
            finally:
                connection.close()

        def cancel(job_id=job.pk, delay=delay):
            time.sleep(delay)
            try:
                services.job_cancel(job=Job.objects.get(pk=job_id), actor=SYSTEM)
            finally:
                connection.close()

        threads = [threading.Thread(target=dispatch), threading.Thread(target=cancel)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        jobs.append(job)
    dropped.run()  # the worker runs what was queued (the cancel tasks)
    settle(jobs)
    for job in jobs:
        job.refresh_from_db()
        assert job.status == JobStatus.CANCELLED, (job.pk, job.status, job.status_reason)
        assert alive_processes(job) == [], f"job {job.pk} still runs"


# --- 6. the reconciler redoes lost tasks -------------------------------------------------


def reconcile_later(dropped: DroppedTasks, job: Job) -> list[str]:
    """The reconciler, a minute and a half on, and the worker running what it queued."""
    dropped.sent.clear()
    later = timezone.now() + timedelta(seconds=90)
    services.jobs_reconcile(now=later)
    names = dropped.names(job.pk)
    dropped.run()
    return names


@pytest.mark.django_db(transaction=True)
def test_a_lost_dispatch_is_redone(world, catalog, dropped):
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=spec(SLEEP))
    assert dropped.names(job.pk) == ["jobs.tasks.jobs_dispatch_task"]  # lost at commit
    assert reconcile_later(dropped, job) == ["jobs.tasks.jobs_dispatch_task"]
    job = wait_for_status(job, {JobStatus.RUNNING})
    services.job_cancel(job=job, actor=SYSTEM)
    dropped.run()
    settle([job])


@pytest.mark.django_db(transaction=True)
def test_a_sweep_starts_local_jobs_one_at_a_time(world, catalog, dropped):
    """The host's GPU devices are handed out one start at a time (`_assign_devices`), in
    the same sweep as every other job: no task of their own."""
    jobs = [
        services.job_submit(tenant=world.tenant, user=world.member, spec=spec(SLEEP, name=f"l{n}"))
        for n in range(2)
    ]
    # Sweeps only (the first starts both), and nothing queued by them.
    assert {name for name, *_ in dropped.run()} == {"jobs.tasks.jobs_dispatch_task"}
    assert dropped.sent == []
    jobs = [wait_for_status(job, {JobStatus.RUNNING}) for job in jobs]
    for job in jobs:
        services.job_cancel(job=job, actor=SYSTEM)
    dropped.run()
    settle(jobs)


@pytest.mark.django_db(transaction=True)
def test_lost_pause_and_resume_are_redone(world, catalog, dropped):
    job = launch(world, spec(SLEEP))
    dropped.sent.clear()
    services.job_pause(job=job, actor=SYSTEM)
    job.refresh_from_db()
    assert job.status == JobStatus.PAUSING and dropped.names(job.pk) == [
        "jobs.tasks.job_suspend_task"
    ]
    assert reconcile_later(dropped, job) == ["jobs.tasks.job_suspend_task"]
    job = wait_for_status(job, {JobStatus.PAUSED})
    dropped.sent.clear()
    services.job_resume(job=job, actor=SYSTEM)
    job.refresh_from_db()
    assert job.status == JobStatus.RESUMING
    assert reconcile_later(dropped, job) == ["jobs.tasks.job_resume_task"]
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    services.job_cancel(job=job, actor=SYSTEM)
    dropped.run()
    settle([job])


@pytest.mark.django_db(transaction=True)
def test_a_lost_cancel_of_a_running_job_is_redone(world, catalog, dropped):
    job = launch(world, spec(SLEEP))
    job = wait_for_status(job, {JobStatus.RUNNING})
    services.job_cancel(job=job, actor=SYSTEM)
    assert dropped.names(job.pk)[-1] == "jobs.tasks.job_cancel_task"
    dropped.sent.clear()  # lost: the process still runs
    time.sleep(0.3)
    assert alive_processes(job)
    assert reconcile_later(dropped, job) == ["jobs.tasks.job_cancel_task"]
    settle([job])
    assert alive_processes(job) == []
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


@pytest.mark.django_db(transaction=True)
def test_a_provisioning_job_is_observed_by_the_reconciler(world, catalog, dropped):
    """`provisioning` too long: the reconciler observes it (a watch event may be lost)."""
    job = launch(world, spec(["python", "-c", "print('done')"]))
    # A backend that accepts before running would leave it provisioning; the state
    # machine lets a running local job go nowhere back, so reach it from a fresh one.
    job2 = services.job_submit(tenant=world.tenant, user=world.member, spec=spec(SLEEP))
    LocalBackend().submit(job2)
    job2 = job_transition(job=job2, to=JobStatus.PROVISIONING, actor=SYSTEM, reason="submitted")
    assert services.jobs_reconcile(now=timezone.now() + timedelta(seconds=90)).count(job2.pk)
    job2.refresh_from_db()
    assert job2.status == JobStatus.RUNNING
    for each in (job, job2):
        each.refresh_from_db()
        if not each.is_finished:
            services.job_cancel(job=each, actor=SYSTEM)
    dropped.run()
    settle([job, job2])


# --- 7. max runtime counts running time ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_max_runtime_counts_running_time_not_pauses(world, catalog, dropped):
    job = launch(world, spec(SLEEP, max_runtime_minutes=1))
    job = wait_for_status(job, {JobStatus.RUNNING})
    assert job.running_since is not None
    dropped.sent.clear()
    # 40 s running, then paused for an hour: 40 s consumed.
    services.job_pause(job=job, actor=SYSTEM)
    job.refresh_from_db()
    Job.objects.filter(pk=job.pk).update(running_since=None, run_seconds=40)
    dropped.run()
    job = wait_for_status(job, {JobStatus.PAUSED})
    assert job.run_seconds == 40 and job.running_since is None
    services.job_resume(job=job, actor=SYSTEM)
    dropped.run()
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.running_since is not None
    # 15 s later, an hour after the first start: 55 s of running time, still within.
    services.jobs_observe(backend_name="local", now=job.running_since + timedelta(seconds=15))
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING, job.status_reason
    # 25 s later: 65 s of running time, over the minute.
    services.jobs_observe(backend_name="local", now=job.running_since + timedelta(seconds=25))
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "maximum runtime" in job.status_reason
    settle([job])
    assert alive_processes(job) == []


@pytest.mark.django_db(transaction=True)
def test_max_runtime_is_checked_in_every_holding_status(world, catalog, dropped):
    """A job stuck `pausing` (SIGTERM ignored) with its running time used up fails."""
    job = launch(world, spec(SLEEP, max_runtime_minutes=1))
    job = wait_for_status(job, {JobStatus.RUNNING})
    services.job_pause(job=job, actor=SYSTEM)  # the suspend task is lost: still running
    job.refresh_from_db()
    assert job.status == JobStatus.PAUSING and job.run_seconds < 60
    Job.objects.filter(pk=job.pk).update(run_seconds=61)
    services.jobs_observe(backend_name="local")
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "maximum runtime" in job.status_reason
    settle([job])
    assert alive_processes(job) == []


# --- 8. GPU assignment under concurrency (PostgreSQL) --------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="row/advisory locks are PostgreSQL's; SQLite serialises writers by itself",
)
def test_two_concurrent_dispatches_never_share_a_gpu(world, catalog, monkeypatch, dropped):
    h100 = "NVIDIA H100 80GB HBM3"
    monkeypatch.setattr(local_backend, "nvml_devices", lambda: [(i, h100) for i in range(4)])
    capacity_sync(backend=LocalBackend())
    ids = []
    for _ in range(2):
        job = services.job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=spec(SLEEP, gpu_type="h100-80gb", gpus_per_node=2, region="local"),
        )
        assert job.status == JobStatus.DISPATCHING, job.status_reason
        ids.append(job.pk)
    queue = list(ids)
    lock = threading.Lock()

    def dispatch_one():
        with lock:
            job_id = queue.pop()
        services.job_dispatch(job=Job.objects.get(pk=job_id))

    run_at_once(dispatch_one, copies=2)
    jobs = list(Job.objects.filter(pk__in=ids))
    first, second = (set(job.assigned_devices) for job in jobs)
    assert len(first) == len(second) == 2 and not first & second
    for job in jobs:
        services.job_cancel(job=job, actor=SYSTEM)
    dropped.run()
    settle(jobs)
