"""Issue 13 §4: the metering tick and admission take their locks in one order (see
docs/architecture.md, "Lock order"), so running them at once never deadlocks.

PostgreSQL only: SQLite serialises every writer, so there is nothing to race there; on
PostgreSQL a lock cycle is a "deadlock detected" error in one of the threads, which
run_at_once re-raises here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from billing.budgets.services import budget_create, meter_and_enforce
from jobs.actors import SYSTEM
from jobs.models import Job, JobStatus
from jobs.services import job_cancel, jobs_admit
from tests.billing.conftest import make_job, set_status
from tests.concurrency import run_at_once
from tests.jobs_helpers import submit

ROUNDS = 8

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="SQLite serialises writers: lock order only matters on PostgreSQL",
    ),
]


def at_once(*actions: Callable[[], object]) -> None:
    """Run each action in its own thread (and connection), all released together."""
    remaining = list(actions)
    take = threading.Lock()

    def next_action() -> None:
        with take:
            action = remaining.pop()
        action()

    run_at_once(next_action, copies=len(actions), timeout=120)


def test_metering_ticks_and_admissions_at_once_never_deadlock(world, catalog):
    now = timezone.now()
    since = now - timedelta(minutes=10)
    # Running jobs the tick locks and meters; a budget so enforcement runs after each tick.
    running = []
    for n in range(6):
        job = make_job(world, name=f"run-{n}", cpus=2)
        set_status(job, JobStatus.RUNNING, since)
        running.append(job)
    # A requeued job: queued, yet a metering candidate (it changed since it was metered).
    requeued = make_job(world, name="requeued", cpus=2)
    set_status(requeued, JobStatus.RUNNING, since)
    set_status(requeued, JobStatus.QUEUED, since + timedelta(minutes=1), attempt=2)
    budget_create(tenant=world.tenant, user=world.owner, name="Cap", amount="1000000")

    def metering() -> None:
        for _ in range(ROUNDS):
            meter_and_enforce(now=timezone.now())

    def launches() -> None:
        for n in range(ROUNDS):
            submit(world, f"new-{n}", cpus=4)  # admission of one job (pools, quota, queue)
            jobs_admit()  # a full pass

    def cancels() -> None:
        # A status change that frees compute locks its job, then admits others.
        for job in running:
            job_cancel(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
            jobs_admit()

    at_once(metering, launches, cancels, metering)

    # Cancelling (no backend here reports their work gone): still holding their compute.
    assert not Job.objects.filter(pk__in=[j.pk for j in running]).exclude(
        status=JobStatus.CANCELLING
    )
    assert Job.objects.filter(tenant=world.tenant, name__startswith="new-").count() == ROUNDS
