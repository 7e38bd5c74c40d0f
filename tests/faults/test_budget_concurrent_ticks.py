"""Issue 15, fault test 6: a budget is crossed under two metering ticks that run at once
(two threads, each with its own database connection, released together; the same `now`
in some rounds, overlapping ones in others). Each non-critical job is paused exactly once
(one `pausing` event, one audit entry, one suspend task queued), critical jobs are left
running, the 100 % alert is recorded once, and the ledger bills each second once.

The whole tick runs in each thread (`meter_and_enforce`, what the beat's task runs):
metering, then enforcement for every tenant with a budget. On PostgreSQL the two race
for real (the tick's advisory lock, SKIP LOCKED rows, the jobs' row locks); SQLite
serialises its writers, so there the rounds check the same outcome without the race.
"""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import billing.budgets.services
from billing.budgets.services import budget_create, meter_and_enforce
from billing.models import Budget, BudgetAlert, UsageRecord
from billing.selectors import period_start
from console.models import AuditEvent
from console.service_errors import ServiceError
from jobs.models import Job, JobEvent, JobStatus
from tests.billing.conftest import make_job, set_status
from tests.broker import broker_replaced
from tests.concurrency import run_at_once
from tests.conftest import make_world
from tests.faults.kube_helpers import report

ROUNDS = 8
NON_CRITICAL = 4  # per round: normal and low priority
CRITICAL = 2
TINY = "0.000001"  # any usage exhausts it
SUSPEND = "jobs.tasks.job_suspend_task"


@pytest.mark.faults
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_ticks_pause_each_non_critical_job_once(catalog, monkeypatch):
    started = time.monotonic()
    queued: list[tuple[str, tuple]] = []
    lock = threading.Lock()

    def record_task(task, args, countdown):
        with lock:
            queued.append((task.name, args))

    broker_replaced(monkeypatch, record_task)
    # How often the other tick got to a job first (its pause then made no change here).
    attempts = {"made": 0, "found_done": 0}
    real_pause_once = billing.budgets.services.job_pause_once

    def counting_pause_once(**kwargs):
        try:
            made = real_pause_once(**kwargs)
        except ServiceError:
            made = False
        with lock:
            attempts["made" if made else "found_done"] += 1
        return made

    monkeypatch.setattr(billing.budgets.services, "job_pause_once", counting_pause_once)
    rounds = []
    for number in range(ROUNDS):
        world = make_world(f"budget{number}")
        now = timezone.now()
        since = max(now - timedelta(minutes=10), period_start(now))
        # Highest priority first: a job launched into a full pool after lower-priority
        # jobs of its organisation would preempt them (admission); this test is about
        # budget ticks, not preemption.
        critical = [_running(world, f"serve-{n}", since, "critical") for n in range(CRITICAL)]
        paused_kind = [
            _running(world, f"train-{n}", since, "low" if n % 2 else "normal")
            for n in sorted(range(NON_CRITICAL), key=lambda n: n % 2)
        ]
        budget = budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
        assert all(Job.objects.get(pk=j.pk).status == JobStatus.RUNNING for j in paused_kind)
        # Two ticks at once: the same clock in even rounds, a second apart in odd ones.
        clocks = [now, now] if number % 2 == 0 else [now, now + timedelta(seconds=1)]
        pick = itertools.count()
        run_at_once(lambda clocks=clocks, pick=pick: meter_and_enforce(now=clocks[next(pick)]))
        rounds.append((world, budget, paused_kind, critical, since))
    last_clock = max(clocks)  # every tick meters every job: the last one's clock ends them all

    pause_events = audits = suspend_tasks = untouched = lost = doubled = records = 0
    for world, budget, paused_kind, critical, since in rounds:
        for job in paused_kind:
            job.refresh_from_db()
            events = JobEvent.objects.filter(job=job, to_status=JobStatus.PAUSING)
            audit = AuditEvent.objects.filter(action="job.paused_by_budget", target_id=str(job.pk))
            tasks = queued.count((SUSPEND, (job.pk,)))
            pause_events += events.count()
            audits += audit.count()
            suspend_tasks += tasks
            lost += job.status != JobStatus.PAUSING
            doubled += max(0, events.count() - 1) + max(0, audit.count() - 1) + max(0, tasks - 1)
            assert job.status == JobStatus.PAUSING and job.paused_by_budget, job.status
            assert [e.actor for e in events] == ["budget"]
            assert "Team cap" in events.get().reason
            assert audit.count() == 1 and tasks == 1
        for job in critical:
            job.refresh_from_db()
            assert job.status == JobStatus.RUNNING and not job.paused_by_budget
            assert not JobEvent.objects.filter(job=job, to_status=JobStatus.PAUSING).exists()
            assert not AuditEvent.objects.filter(
                target_id=str(job.pk), action__in=["job.paused_by_budget", "job.resumed_by_budget"]
            ).exists()
            assert queued.count((SUSPEND, (job.pk,))) == 0
            untouched += 1
        # One alert per threshold crossed, and its audit entry once.
        hundred = BudgetAlert.objects.filter(budget=budget, threshold=100, kind="actual")
        assert hundred.count() == 1
        for threshold in budget.thresholds:
            crossed = AuditEvent.objects.filter(
                action="budget.threshold_actual",
                target_id=str(budget.pk),
                metadata__threshold=threshold,
            )
            assert crossed.count() == 1, threshold
        # The ledger: every job billed from `since` to the last clock, each second once.
        for job in [*paused_kind, *critical]:
            rows = list(UsageRecord.objects.filter(job_ref=job.pk).order_by("interval_start"))
            records += len(rows)
            assert rows[0].interval_start == since and rows[-1].interval_end == last_clock
            for a, b in itertools.pairwise(rows):
                assert a.interval_end == b.interval_start, (
                    job.pk,
                    a.interval_end,
                    b.interval_start,
                )
    assert Budget.objects.count() == ROUNDS
    assert attempts["made"] == ROUNDS * NON_CRITICAL

    report(
        f"FAULTS budget-concurrent-ticks: rounds={ROUNDS} ticks={2 * ROUNDS} "
        f"jobs={ROUNDS * (NON_CRITICAL + CRITICAL)} non_critical={ROUNDS * NON_CRITICAL} "
        f"paused_once={pause_events} audits={audits} suspend_tasks={suspend_tasks} "
        f"critical_untouched={untouched} pauses_made={attempts['made']} "
        f"found_paused_by_the_other_tick={attempts['found_done']} usage_records={records} "
        f"lost={lost} "
        f"doubled={doubled} db={connection.vendor}"
        f"{' (writers serialised)' if connection.vendor == 'sqlite' else ''} "
        f"seconds={time.monotonic() - started:.1f}"
    )


def _running(world, name: str, since, priority: str) -> Job:
    """A 1-vCPU job submitted just before `since` and running since then (critical jobs
    are launched by an admin: members may not)."""
    job = make_job(world, name=name, priority=priority, start=since)
    return set_status(job, JobStatus.RUNNING, since)
