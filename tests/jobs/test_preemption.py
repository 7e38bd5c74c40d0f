"""Preemption in admission: a queued job that can't fit stops the least it must of
lower-priority jobs (its own organisation's first; other organisations' spot-only jobs
where staff allow it in the pool; never their on-demand ones), only past the pool's
utilisation threshold; victims are requeued as a new attempt through the state machine
with a timeline naming who preempted them; no preemption loops; gangs all or nothing.

The victim choice is checked against brute force (hypothesis) on small cases."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs import services, tasks
from jobs.actors import ActorKind
from jobs.models import HOLDING_COMPUTE, PRIORITY_RANK, Job, JobEvent, JobStatus
from jobs.services import preemption
from jobs.services.preemption import REQUEUED_REASON, Candidate, choose_victims
from marketplace.demo import seed_catalog
from marketplace.models import GpuType, NodePool, Region, TenantQuota, Tier
from tests import jobs_helpers
from tests.broker import broker_replaced
from tests.jobs_helpers import advance_to, at_time
from tests.preemption_oracle import brute_force_victims

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# --- the victim choice, against brute force ------------------------------------------------


candidate_lists = st.lists(
    st.builds(
        lambda units, weight, minutes, own: (units, weight, minutes, own),
        st.integers(1, 8),
        st.sampled_from([1, 2, 4]),
        st.integers(0, 5),
        st.booleans(),
    ),
    max_size=9,
)


@settings(max_examples=300, deadline=None)
@given(need=st.integers(0, 20), rows=candidate_lists)
def test_victims_are_the_cheapest_sufficient_set_as_brute_force_finds(need, rows):
    candidates = [
        Candidate(key=key, units=u, weight=w, started=T0 + timedelta(minutes=m), own=own)
        for key, (u, w, m, own) in enumerate(rows, start=1)
    ]
    chosen = choose_victims(need, candidates)
    if need == 0:
        assert chosen == []
        return
    assert chosen == brute_force_victims(need, candidates)
    if chosen:
        freed = sum(c.units for c in chosen)
        assert freed >= need
        # Never more than needed: without any one of them there isn't enough.
        assert all(freed - c.units < need for c in chosen)


def test_equal_costs_go_to_the_newest_victims():
    old = Candidate(key=1, units=2, weight=1, started=T0, own=True)
    new = Candidate(key=2, units=2, weight=1, started=T0 + timedelta(hours=1), own=True)
    assert choose_victims(2, [old, new]) == [new]


def test_own_organisation_first_even_when_anothers_job_costs_less():
    own = Candidate(key=1, units=2, weight=2, started=T0, own=True)
    others = Candidate(key=2, units=2, weight=1, started=T0, own=False)
    assert choose_victims(2, [own, others]) == [own]
    # Only when its own can't free enough are others' taken, still the least of them.
    assert choose_victims(3, [own, others]) == [own, others]


# --- admission ---------------------------------------------------------------------------------


def _pool(slug: str, *, tier: str = Tier.ON_DEMAND, nodes: int = 1, **knobs) -> NodePool:
    return NodePool.objects.create(
        slug=slug,
        name=slug,
        region=Region.objects.get(slug="local"),
        backend="local",
        tier=tier,
        gpu_type=GpuType.objects.get(slug="h100-80gb"),
        node_count=nodes,
        gpus_per_node=8,
        total_gpus=8 * nodes,
        allocatable_gpus=8 * nodes,
        vcpus_per_node=64,
        allocatable_vcpus=64 * nodes,
        **knobs,
    )


@pytest.fixture
def h100(db, settings) -> NodePool:
    settings.COMPUTE_BACKENDS = ["local"]
    seed_catalog()
    return _pool("t-h100")


@pytest.fixture
def h100_spot(h100) -> NodePool:
    return _pool("t-h100-spot", tier=Tier.SPOT, preempt_other_tenants_spot=True)


def _no_quotas(*worlds) -> None:
    # New organisations get a default quota; these tests are about capacity.
    TenantQuota.objects.filter(tenant__in=[w.tenant for w in worlds]).delete()


def gpu_job(world, name: str, *, gpus: int, priority: str = "normal", **spec) -> Job:
    return jobs_helpers.submit(
        world,
        name,
        gpu_type="h100-80gb",
        region="local",
        gpus_per_node=gpus,
        cpus=None,
        priority=priority,
        **spec,
    )


def running(world, name: str, *, gpus: int, priority: str, minutes: int = 0, **spec) -> Job:
    """A job admitted at once and running since T0 + `minutes`."""
    job = gpu_job(world, name, gpus=gpus, priority=priority, **spec)
    assert job.status == JobStatus.DISPATCHING, job.status_reason
    return advance_to(job, JobStatus.RUNNING, at=T0 + timedelta(minutes=minutes))


def statuses(*jobs: Job) -> list[str]:
    for job in jobs:
        job.refresh_from_db()
    return [job.status for job in jobs]


def preemption_event(job: Job) -> JobEvent:
    return job.events.get(to_status=JobStatus.PREEMPTED)


def test_a_critical_job_preempts_the_least_it_must_of_its_own_organisation(
    world, h100, django_capture_on_commit_callbacks, monkeypatch
):
    _no_quotas(world)
    big_low = running(world, "big-low", gpus=4, priority="low")
    small_low = running(world, "small-low", gpus=2, priority="low", minutes=5)
    normal = running(world, "normal", gpus=2, priority="normal", minutes=10)
    sent: list[tuple[str, tuple]] = []
    broker_replaced(monkeypatch, lambda task, args, countdown: sent.append((task.name, args)))

    with django_capture_on_commit_callbacks(execute=True):
        critical = gpu_job(world, "critical", gpus=2, priority="critical")

    assert critical.status == JobStatus.DISPATCHING
    assert statuses(big_low, small_low, normal) == [
        JobStatus.RUNNING,
        JobStatus.QUEUED,
        JobStatus.RUNNING,
    ]
    # The spot-reclaim path: preempted, then queued as the next attempt.
    assert small_low.attempt == 2
    assert [e.to_status for e in small_low.events.all()][-2:] == [
        JobStatus.PREEMPTED,
        JobStatus.QUEUED,
    ]
    event = preemption_event(small_low)
    assert event.actor_kind == ActorKind.PREEMPTION and event.actor == "preemption"
    assert f"job #{critical.pk} critical" in event.reason
    assert "critical priority, this one low" in event.reason
    assert small_low.events.last().reason == REQUEUED_REASON
    assert critical.events.filter(
        reason__contains=f"preempting 1 lower-priority job(s): #{small_low.pk}"
    ).exists()
    # Its old attempt is stopped with notice, after commit.
    assert (tasks.job_preempted_stop_task.name, (small_low.pk, 1)) in sent
    held = sum(j.total_gpus for j in Job.objects.filter(status__in=HOLDING_COMPUTE))
    assert held == 8


def test_equal_costs_preempt_the_newest(world, h100):
    _no_quotas(world)
    older = running(world, "older", gpus=4, priority="low", minutes=0)
    newer = running(world, "newer", gpus=4, priority="low", minutes=30)
    gpu_job(world, "critical", gpus=4, priority="critical")
    assert statuses(older, newer) == [JobStatus.RUNNING, JobStatus.QUEUED]


def test_no_preemption_of_equal_or_higher_priority(world, h100):
    _no_quotas(world)
    holder = running(world, "holder", gpus=8, priority="normal")
    waiting = gpu_job(world, "waiting", gpus=2, priority="normal")
    assert statuses(holder, waiting) == [JobStatus.RUNNING, JobStatus.QUEUED]
    assert waiting.status_reason == "waiting for 2 GPUs in t-h100 (0 free)"


def test_below_the_pool_threshold_no_one_is_preempted(world, h100):
    _no_quotas(world)
    low = running(world, "low", gpus=4, priority="low")  # 50 % of the pool in use
    critical = gpu_job(world, "critical", gpus=6, priority="critical")
    assert statuses(low, critical) == [JobStatus.RUNNING, JobStatus.QUEUED]

    NodePool.objects.filter(pk=h100.pk).update(preemption_threshold=Decimal("0.5"))
    services.jobs_admit(pools=[h100.pk])
    assert statuses(low, critical) == [JobStatus.QUEUED, JobStatus.DISPATCHING]


def test_a_victim_never_preempts_its_preemptor_back(world, h100):
    _no_quotas(world)
    normal = running(world, "normal", gpus=8, priority="normal")
    critical = gpu_job(world, "critical", gpus=8, priority="critical")
    assert statuses(normal, critical) == [JobStatus.QUEUED, JobStatus.DISPATCHING]
    advance_to(critical, JobStatus.RUNNING)
    for _ in range(3):  # passes after passes: the requeued victim only waits
        services.jobs_admit()
    assert statuses(normal, critical) == [JobStatus.QUEUED, JobStatus.RUNNING]
    assert critical.events.filter(to_status=JobStatus.PREEMPTED).count() == 0


def test_random_traffic_has_no_preemption_loops(world, other_world, h100, h100_spot):
    """Jobs of mixed priorities, sizes and tiers of two organisations arrive, run and
    end; every preemption stops a strictly lower-priority job, and no two jobs ever
    preempt each other."""
    _no_quotas(world, other_world)
    NodePool.objects.filter(pk__in=[h100.pk, h100_spot.pk]).update(preemption_threshold=Decimal(0))
    rng = random.Random(31)
    jobs: list[Job] = []
    for step in range(40):
        owner = rng.choice([world, other_world])
        spec = {"spot_ratio": Decimal(1)} if rng.random() < 0.5 else {}
        jobs.append(
            gpu_job(
                owner,
                f"j{step}",
                gpus=rng.choice([1, 2, 4, 8]),
                priority=rng.choice(["low", "normal", "critical"]),
                **spec,
            )
        )
        for job in Job.objects.filter(status=JobStatus.DISPATCHING):
            advance_to(job, JobStatus.RUNNING)
        if rng.random() < 0.3:
            live = list(Job.objects.filter(status=JobStatus.RUNNING))
            if live:
                advance_to(rng.choice(live), JobStatus.SUCCEEDED)
                services.jobs_admit()
    preemptions = list(JobEvent.objects.filter(to_status=JobStatus.PREEMPTED))
    assert preemptions, "the traffic should preempt something"
    by_pk = {job.pk: job for job in Job.objects.all()}
    # The preemptor's note names its own organisation's victims.
    pairs = {
        (note.job_id, int(victim))
        for note in JobEvent.objects.filter(actor_kind=ActorKind.PREEMPTION).exclude(
            to_status=JobStatus.PREEMPTED
        )
        for victim in re.findall(r"#(\d+)", note.reason)
    }
    assert pairs
    for preemptor, victim in pairs:
        assert PRIORITY_RANK[by_pk[victim].priority] > PRIORITY_RANK[by_pk[preemptor].priority]
    for event in preemptions:
        # Every victim, named or not, was stopped for a strictly higher priority.
        said = re.search(r"\((\w+) priority, this one|by a (\w+)-priority job", event.reason)
        assert said, event.reason
        higher = said.group(1) or said.group(2)
        assert PRIORITY_RANK[by_pk[event.job_id].priority] > PRIORITY_RANK[higher]
    assert not {(b, a) for a, b in pairs} & pairs


def test_other_organisations_spot_jobs_only_where_staff_allow_it(world, other_world, h100_spot):
    _no_quotas(world, other_world)
    theirs = running(other_world, "theirs", gpus=8, priority="low", spot_ratio=Decimal(1))
    NodePool.objects.filter(pk=h100_spot.pk).update(preempt_other_tenants_spot=False)
    ours = gpu_job(world, "ours", gpus=4, priority="critical", spot_ratio=Decimal(1))
    assert statuses(theirs, ours) == [JobStatus.RUNNING, JobStatus.QUEUED]

    NodePool.objects.filter(pk=h100_spot.pk).update(preempt_other_tenants_spot=True)
    services.jobs_admit(pools=[h100_spot.pk])
    assert statuses(theirs, ours) == [JobStatus.QUEUED, JobStatus.DISPATCHING]
    reason = preemption_event(theirs).reason
    # Their timeline says why, without naming our job.
    assert "another organisation" in reason and ours.name not in reason
    assert f"#{ours.pk}" not in reason


def test_other_organisations_on_demand_jobs_are_never_preempted(world, other_world, h100):
    _no_quotas(world, other_world)
    NodePool.objects.filter(pk=h100.pk).update(
        preempt_other_tenants_spot=True, preemption_threshold=Decimal(0)
    )
    theirs = running(other_world, "theirs", gpus=8, priority="low")
    ours = gpu_job(world, "ours", gpus=2, priority="critical")
    assert statuses(theirs, ours) == [JobStatus.RUNNING, JobStatus.QUEUED]


def test_a_quota_that_still_blocks_means_no_one_is_preempted(world, other_world, h100_spot):
    _no_quotas(world, other_world)
    theirs = running(other_world, "theirs", gpus=8, priority="low", spot_ratio=Decimal(1))
    TenantQuota.objects.create(tenant=world.tenant, max_gpus=4)
    ours = running(world, "ours", gpus=4, priority="normal")  # on demand: all its quota
    critical = gpu_job(world, "critical", gpus=4, priority="critical", spot_ratio=Decimal(1))
    # Stopping `theirs` would make room in the spot pool, but our quota still says no.
    assert statuses(theirs, ours, critical) == [
        JobStatus.RUNNING,
        JobStatus.RUNNING,
        JobStatus.QUEUED,
    ]
    assert not JobEvent.objects.filter(to_status=JobStatus.PREEMPTED).exists()


# --- gangs ------------------------------------------------------------------------------------


def test_a_multi_node_job_is_admitted_whole_or_not_at_all(world, db, settings):
    settings.COMPUTE_BACKENDS = ["local"]
    seed_catalog()
    pool = _pool("t-h100-2n", nodes=2)
    _no_quotas(world)
    holder = running(world, "holder", gpus=4, priority="normal")
    gang = gpu_job(world, "gang", gpus=8, nodes=2, priority="normal")
    assert gang.status == JobStatus.QUEUED
    assert gang.status_reason == f"waiting for 16 GPUs in {pool.name} (12 free)"
    # Nothing of it holds compute while it waits.
    held = sum(j.total_gpus for j in Job.objects.filter(status__in=HOLDING_COMPUTE))
    assert held == holder.total_gpus
    advance_to(holder, JobStatus.SUCCEEDED)
    services.jobs_admit()
    assert statuses(gang) == [JobStatus.DISPATCHING]


def test_preemption_for_a_gang_frees_all_it_needs_or_stops_no_one(world, db, settings):
    settings.COMPUTE_BACKENDS = ["local"]
    seed_catalog()
    _pool("t-h100-2n", nodes=2)
    _no_quotas(world)
    low = running(world, "low", gpus=6, priority="low")
    normal = running(world, "normal", gpus=8, priority="normal")
    # 14 of 16 held; a critical 2 × 8 gang needs 16: only stopping both makes room.
    gang = gpu_job(world, "gang", gpus=8, nodes=2, priority="critical")
    assert statuses(low, normal, gang) == [
        JobStatus.QUEUED,
        JobStatus.QUEUED,
        JobStatus.DISPATCHING,
    ]


def test_no_one_is_stopped_when_preemption_cant_free_a_whole_gang(world, db, settings):
    settings.COMPUTE_BACKENDS = ["local"]
    seed_catalog()
    _pool("t-h100-2n", nodes=2)
    _no_quotas(world)
    critical = running(world, "critical", gpus=8, priority="critical")
    lows = [running(world, f"low-{i}", gpus=4, priority="low") for i in range(2)]
    # The lows free 8 of the 16 a normal 2 × 8 gang needs: it waits, they run on.
    gang = gpu_job(world, "gang", gpus=8, nodes=2, priority="normal")
    assert statuses(critical, *lows, gang) == [
        JobStatus.RUNNING,
        JobStatus.RUNNING,
        JobStatus.RUNNING,
        JobStatus.QUEUED,
    ]


class RecordingBackend:
    """Records which attempt it is told to stop (the backend is the edge here)."""

    def __init__(self):
        self.suspended: list[tuple[int, int]] = []

    def suspend(self, job: Job) -> None:
        self.suspended.append((job.pk, job.attempt))


def test_the_preempted_stop_acts_only_before_the_next_attempt_starts(world, h100, monkeypatch):
    _no_quotas(world)
    low = running(world, "low", gpus=8, priority="low")
    with at_time(T0 + timedelta(hours=1)):
        gpu_job(world, "critical", gpus=8, priority="critical")
    low.refresh_from_db()
    assert (low.status, low.attempt) == (JobStatus.QUEUED, 2)
    backend = RecordingBackend()
    monkeypatch.setattr(preemption, "get_backend", lambda name: backend)
    services.job_preempted_stop(job=low, attempt=1)
    assert backend.suspended == [(low.pk, 1)]
    services.job_preempted_stop(job=low, attempt=0)  # not the attempt before this one
    advance_to(low, JobStatus.RUNNING)
    services.job_preempted_stop(job=low, attempt=1)  # the new attempt runs: too late
    assert backend.suspended == [(low.pk, 1)]
