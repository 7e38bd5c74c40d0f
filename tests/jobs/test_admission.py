"""Admission: what fits starts at once, the rest queues with a reason, and queued jobs are
admitted in priority then FIFO order when compute frees up, within pool capacity and the
tenant's quota. Also the state machine's table and spot placement.

Only admission is exercised here (nothing is dispatched), so the pools are rows made
directly: one small local CPU pool, a spot CPU pool, and two local GPU pools.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from itertools import product

import pytest
from django.db import connection
from django.db.models.signals import post_init
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from console.models import Tenant
from console.service_errors import ServiceError
from jobs import services
from jobs.actors import BACKEND, SYSTEM
from jobs.backends import Observation
from jobs.models import HOLDING_COMPUTE, Job, JobEvent, JobStatus, WaitKind
from jobs.selectors import queue_position, queued_in_order
from jobs.services.admission import BEHIND_IN_POOL, BEHIND_OWN_QUOTA, Wait, _hold_rest
from jobs.services.fair_share import FIRST_PAGE
from jobs.state import TRANSITIONS, IllegalTransition, job_transition
from marketplace.demo import seed_catalog
from marketplace.models import GpuType, NodePool, Region, TenantQuota, Tier
from marketplace.pricing import node_split
from tests import jobs_helpers
from tests.conftest import make_world
from tests.factories import JobFactory
from tests.jobs_helpers import advance_to

PRIORITY_NAMES = ["critical", "normal", "low"]
CPU_POOL_VCPUS = 4


@dataclass
class Pools:
    cpu: NodePool
    cpu_spot: NodePool
    h100: NodePool
    a100: NodePool


def _pool(slug: str, *, tier=Tier.ON_DEMAND, gpu_slug: str | None = None, **capacity) -> NodePool:
    return NodePool.objects.create(
        slug=slug,
        name=slug,
        region=Region.objects.get(slug="local"),
        backend="local",
        tier=tier,
        gpu_type=GpuType.objects.get(slug=gpu_slug) if gpu_slug else None,
        node_count=1,
        **capacity,
    )


@pytest.fixture
def pools(db, settings) -> Pools:
    settings.COMPUTE_BACKENDS = ["local"]
    seed_catalog()
    return Pools(
        cpu=_pool("t-cpu", vcpus_per_node=CPU_POOL_VCPUS, allocatable_vcpus=CPU_POOL_VCPUS),
        cpu_spot=_pool(
            "t-cpu-spot",
            tier=Tier.SPOT,
            vcpus_per_node=CPU_POOL_VCPUS,
            allocatable_vcpus=CPU_POOL_VCPUS,
        ),
        h100=_pool(
            "t-h100",
            gpu_slug="h100-80gb",
            gpus_per_node=8,
            total_gpus=8,
            allocatable_gpus=8,
            vcpus_per_node=32,
            allocatable_vcpus=32,
        ),
        a100=_pool(
            "t-a100",
            gpu_slug="a100-80gb",
            gpus_per_node=8,
            total_gpus=8,
            allocatable_gpus=8,
            vcpus_per_node=32,
            allocatable_vcpus=32,
        ),
    )


def submit(world, name: str = "job", *, cpus: int = 1, **spec) -> Job:
    return jobs_helpers.submit(world, name, cpus=cpus, **spec)


def gpu_job(world, name: str = "gpu", *, gpus: int, gpu_type: str = "h100-80gb", **spec) -> Job:
    return submit(world, name, gpu_type=gpu_type, gpus_per_node=gpus, cpus=None, **spec)


def finish(job: Job, to: str = JobStatus.SUCCEEDED) -> Job:
    """What the watcher records when a job ends (without admitting anything itself)."""
    job.refresh_from_db()
    if job.status == JobStatus.DISPATCHING:
        job_transition(job=job, to=JobStatus.RUNNING, actor=BACKEND, reason="running")
    return job_transition(job=job, to=to, actor=BACKEND, reason="done")


def statuses(*jobs: Job) -> list[str]:
    for job in jobs:
        job.refresh_from_db()
    return [job.status for job in jobs]


def reason(job: Job) -> str:
    job.refresh_from_db()
    return job.status_reason


# --- capacity ---------------------------------------------------------------------------------


def test_job_over_free_capacity_queues_with_reason_and_is_admitted_only_when_another_ends(
    world, pools
):
    first = submit(world, "first", cpus=3)
    assert first.status == JobStatus.DISPATCHING and first.status_reason == "admitted"

    second = submit(world, "second", cpus=2)
    assert second.status == JobStatus.QUEUED
    assert second.status_reason == f"waiting for 2 vCPUs in {pools.cpu.name} (1 free)"
    assert queue_position(second) == 1
    assert queue_position(first) is None

    # Still held while it runs: another admission pass changes nothing.
    job_transition(job=first, to=JobStatus.RUNNING, actor=BACKEND, reason="running")
    assert services.jobs_admit() == []
    assert statuses(second) == [JobStatus.QUEUED]

    finish(first)
    assert statuses(second) == [JobStatus.QUEUED]  # the state machine alone admits nothing
    assert [job.pk for job in services.jobs_admit()] == [second.pk]
    assert statuses(second) == [JobStatus.DISPATCHING]
    assert reason(second) == "admitted"
    assert queue_position(second) is None
    assert [e.to_status for e in second.events.all()] == [JobStatus.QUEUED, JobStatus.DISPATCHING]


def test_watcher_seeing_a_job_end_admits_the_next(world, pools):
    running = submit(world, "running", cpus=CPU_POOL_VCPUS)
    waiting = submit(world, "waiting", cpus=CPU_POOL_VCPUS)
    job_transition(job=running, to=JobStatus.RUNNING, actor=BACKEND, reason="running")

    services.job_apply_observation(job=running, observation=Observation(phase="running"))
    assert statuses(waiting) == [JobStatus.QUEUED]

    services.job_apply_observation(
        job=running, observation=Observation(phase="succeeded", exit_code=0)
    )
    assert statuses(running, waiting) == [JobStatus.SUCCEEDED, JobStatus.DISPATCHING]


def test_cancelling_and_pausing_release_compute_for_queued_jobs(world, pools):
    holder = submit(world, "holder", cpus=CPU_POOL_VCPUS)
    second = submit(world, "second", cpus=CPU_POOL_VCPUS)
    third = submit(world, "third", cpus=CPU_POOL_VCPUS)

    services.job_cancel(job=holder, actor=SYSTEM)
    assert statuses(second, third) == [JobStatus.DISPATCHING, JobStatus.QUEUED]

    job_transition(job=second, to=JobStatus.RUNNING, actor=BACKEND, reason="running")
    services.job_pause(job=second, actor=SYSTEM)
    assert statuses(third) == [JobStatus.QUEUED]  # pausing still holds the compute
    services.job_apply_observation(job=second, observation=Observation(phase="suspended"))
    assert statuses(second, third) == [JobStatus.PAUSED, JobStatus.DISPATCHING]


def test_resuming_a_paused_job_never_overcommits_its_pool(world, pools):
    paused = submit(world, "paused", cpus=CPU_POOL_VCPUS)
    job_transition(job=paused, to=JobStatus.RUNNING, actor=BACKEND, reason="running")
    services.job_pause(job=paused, actor=SYSTEM)
    services.job_apply_observation(job=paused, observation=Observation(phase="suspended"))
    taker = submit(world, "taker", cpus=CPU_POOL_VCPUS)
    assert statuses(paused, taker) == [JobStatus.PAUSED, JobStatus.DISPATCHING]

    # Refusing is one acceptable answer; waiting for admission is another.
    with contextlib.suppress(services.ActionRefused):
        services.job_resume(job=paused, actor=SYSTEM)
    held = sum(job.cpus * job.nodes for job in Job.objects.filter(pool=pools.cpu).holding_compute())
    assert held <= CPU_POOL_VCPUS


# --- order --------------------------------------------------------------------------------------


def test_priority_then_fifo_when_capacity_frees(world, pools):
    blocker = submit(world, "blocker", cpus=CPU_POOL_VCPUS)
    order = ["low-1", "normal-1", "critical-1", "normal-2", "low-2", "critical-2"]
    queued = {
        name: submit(world, name, cpus=CPU_POOL_VCPUS, priority=name.split("-")[0])
        for name in order
    }
    assert {job.status for job in queued.values()} == {JobStatus.QUEUED}
    expected = ["critical-1", "critical-2", "normal-1", "normal-2", "low-1", "low-2"]
    assert [queue_position(queued[name]) for name in expected] == [1, 2, 3, 4, 5, 6]

    admitted = []
    running = blocker
    for _ in expected:
        finish(running)
        (running,) = services.jobs_admit()
        admitted.append(running.name)
    assert admitted == expected


def test_several_jobs_admitted_in_one_pass_in_priority_order(world, pools):
    blocker = submit(world, "blocker", cpus=CPU_POOL_VCPUS)
    low = submit(world, "low", cpus=2, priority="low")
    normal = submit(world, "normal", cpus=2)
    critical = submit(world, "critical", cpus=2, priority="critical")
    finish(blocker)
    assert [job.name for job in services.jobs_admit()] == ["critical", "normal"]
    assert statuses(low, normal, critical) == [
        JobStatus.QUEUED,
        JobStatus.DISPATCHING,
        JobStatus.DISPATCHING,
    ]


def test_blocked_big_job_is_not_overtaken_by_a_later_small_one(world, other_world, pools):
    # The small job's organisation holds more of the pool (fair share puts it second).
    small_running = submit(other_world, "running", cpus=2)
    big = submit(world, "big", cpus=CPU_POOL_VCPUS)
    small = submit(other_world, "small", cpus=1)  # would fit in the 2 free vCPUs
    assert statuses(big, small) == [JobStatus.QUEUED, JobStatus.QUEUED]
    assert reason(small) == "waiting behind earlier jobs for the same pool"
    assert queue_position(small) == 2
    # Other pools are not held up by this one's queue.
    assert gpu_job(world, gpus=1).status == JobStatus.DISPATCHING

    assert services.jobs_admit() == []
    finish(small_running)
    services.jobs_admit()
    assert statuses(big, small) == [JobStatus.DISPATCHING, JobStatus.QUEUED]
    assert reason(small).startswith(f"waiting for 1 vCPUs in {pools.cpu.name}")
    finish(big)
    services.jobs_admit()
    assert statuses(small) == [JobStatus.DISPATCHING]


def test_a_critical_job_blocked_on_its_pool_holds_back_normal_ones(world, pools):
    submit(world, "running", cpus=2)
    critical = submit(world, "critical", cpus=CPU_POOL_VCPUS, priority="critical")
    normal = submit(world, "normal", cpus=1)
    assert statuses(critical, normal) == [JobStatus.QUEUED, JobStatus.QUEUED]


# --- quota -------------------------------------------------------------------------------------


def test_max_concurrent_jobs_keeps_jobs_queued_with_a_quota_reason(world, other_world, pools):
    TenantQuota.objects.create(tenant=world.tenant, max_concurrent_jobs=1)
    first = submit(world, "first")
    second = submit(world, "second")
    assert statuses(first, second) == [JobStatus.DISPATCHING, JobStatus.QUEUED]
    assert reason(second) == "quota: at most 1 jobs at once"

    # Another tenant isn't held by this quota, and a quota wait blocks no pool.
    assert submit(other_world, "theirs").status == JobStatus.DISPATCHING

    finish(first)
    services.jobs_admit()
    assert statuses(second) == [JobStatus.DISPATCHING]


def test_max_gpus_per_type_keeps_jobs_queued_with_a_quota_reason(world, other_world, pools):
    h100 = GpuType.objects.get(slug="h100-80gb")
    TenantQuota.objects.create(tenant=world.tenant, gpu_type=h100, max_gpus=4)
    first = gpu_job(world, "first", gpus=4)
    second = gpu_job(world, "second", gpus=2)
    assert statuses(first, second) == [JobStatus.DISPATCHING, JobStatus.QUEUED]
    assert reason(second) == "quota: 4 of 4 GPUs in use"

    # Other GPU types and other tenants are not limited by it.
    assert gpu_job(world, "a100", gpus=4, gpu_type="a100-80gb").status == JobStatus.DISPATCHING
    assert gpu_job(other_world, "theirs", gpus=2).status == JobStatus.DISPATCHING

    finish(first)
    services.jobs_admit()
    assert statuses(second) == [JobStatus.DISPATCHING]


def test_tenant_wide_max_gpus_counts_every_gpu_type(world, pools):
    TenantQuota.objects.create(tenant=world.tenant, max_gpus=6)
    gpu_job(world, "h100", gpus=4)
    # H100 GPUs count against the tenant-wide limit of an A100 job too.
    assert gpu_job(world, "fits", gpus=2, gpu_type="a100-80gb").status == JobStatus.DISPATCHING
    a100 = gpu_job(world, "a100", gpus=4, gpu_type="a100-80gb")
    assert a100.status == JobStatus.QUEUED
    assert a100.status_reason == "quota: 6 of 6 GPUs in use"


def test_quota_blocked_job_is_not_overtaken_by_the_same_tenants_smaller_job(world, pools):
    NodePool.objects.filter(pk=pools.h100.pk).update(
        node_count=2, total_gpus=16, allocatable_gpus=16
    )  # room in the pool: only the quota holds the big job back
    h100 = GpuType.objects.get(slug="h100-80gb")
    TenantQuota.objects.create(tenant=world.tenant, gpu_type=h100, max_gpus=8)
    gpu_job(world, "running", gpus=4)
    big = gpu_job(world, "big", gpus=8)
    assert reason(big) == "quota: 4 of 8 GPUs in use"
    small = gpu_job(world, "small", gpus=2)
    assert statuses(big, small) == [JobStatus.QUEUED, JobStatus.QUEUED]


# --- admission on submit: one job, not the whole queue ------------------------------------


def _queue_for(template: Job, length: int) -> None:
    """`length` jobs queued for `template`'s pool (bulk rows, as if submitted earlier)."""
    rows = []
    for number in range(length):
        row = Job.objects.get(pk=template.pk)
        row.pk, row.name = None, f"waiting-{number}"
        row.status, row.status_reason = JobStatus.QUEUED, "waiting for 8 GPUs in t-a100 (0 free)"
        rows.append(row)
    Job.objects.bulk_create(rows)


def test_submit_costs_the_same_number_of_queries_whatever_the_queue_length(world, pools):
    holder = gpu_job(world, "a100-holder", gpus=8, gpu_type="a100-80gb")
    queries = []
    for length in (3, 60):
        _queue_for(holder, length - Job.objects.filter(status=JobStatus.QUEUED).count())
        with CaptureQueriesContext(connection) as captured:
            admitted = submit(world, f"cpu-{length}", cpus=1)
        assert admitted.status == JobStatus.DISPATCHING
        queries.append(len(captured.captured_queries))
        last = Job.objects.filter(status=JobStatus.QUEUED).order_by("pk").last()
        with CaptureQueriesContext(connection) as captured:
            assert queue_position(last) == length
        assert len(captured.captured_queries) == 1
    assert queries[0] == queries[1]
    # Nothing the submit path decided differs from what a full pass would.
    assert services.jobs_admit() == []


def test_a_launch_behind_a_full_pools_queue_reads_a_page_of_it_and_labels_only_itself(world, pools):
    holder = gpu_job(world, "a100-holder", gpus=8, gpu_type="a100-80gb")
    _queue_for(holder, 60)
    assert services.jobs_admit() == []  # the queue labelled as every pass leaves it
    read: list[int | None] = []

    def count(sender, instance, **kwargs):
        read.append(instance.pk)

    post_init.connect(count, sender=Job)
    try:
        with CaptureQueriesContext(connection) as captured:
            late = gpu_job(world, "late", gpus=8, gpu_type="a100-80gb")
    finally:
        post_init.disconnect(count, sender=Job)
    assert (late.status, late.wait_kind) == (JobStatus.QUEUED, WaitKind.POOL_QUEUE)
    # The pass stopped at the queue's first job: it read one page, not 60 rows, and
    # wrote only the launch's own label.
    assert len(read) <= FIRST_PAGE + 1  # (+ the launch's own instance)
    writes = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("UPDATE")]
    assert len([sql for sql in writes if '"jobs_job"' in sql]) == 1
    labels = list(Job.objects.order_by("pk").values_list("pk", "wait_kind", "status_reason"))
    assert services.jobs_admit() == []  # a full pass finds nothing to change
    assert (
        list(Job.objects.order_by("pk").values_list("pk", "wait_kind", "status_reason")) == labels
    )


def test_a_backlog_over_several_pages_is_admitted_first_come_first_served(world, pools):
    holder = gpu_job(world, "a100-holder", gpus=8, gpu_type="a100-80gb")
    one_gpu = gpu_job(world, "one", gpus=1, gpu_type="a100-80gb")
    backlog = 150  # three pages (16, 128, ...); the rows share one created_at: pk decides
    _queue_for(one_gpu, backlog - 1)
    NodePool.objects.filter(pk=pools.a100.pk).update(total_gpus=148, allocatable_gpus=148)
    admitted = services.jobs_admit(pools=[pools.a100.pk])
    queued = list(Job.objects.exclude(pk=holder.pk).order_by("created_at", "pk"))
    assert [job.pk for job in admitted] == [job.pk for job in queued[:140]]
    assert {job.status for job in queued[:140]} == {JobStatus.DISPATCHING}
    assert queued[140].wait_kind == WaitKind.CAPACITY
    assert {(job.status, job.wait_kind) for job in queued[141:]} == {
        (JobStatus.QUEUED, WaitKind.POOL_QUEUE)
    }


def test_the_rest_of_a_blocked_queue_is_relabelled_in_one_read(world, pools):
    holder = gpu_job(world, "a100-holder", gpus=8, gpu_type="a100-80gb")
    start = timezone.now()

    def queued(name: str, tenant: Tenant, seconds: int, *, label=BEHIND_IN_POOL) -> Job:
        row = Job.objects.get(pk=holder.pk)
        row.pk, row.name, row.tenant = None, name, tenant
        row.status, row.wait_kind, row.status_reason = JobStatus.QUEUED, label.kind, label.message
        row.save()
        Job.objects.filter(pk=row.pk).update(created_at=start + timedelta(seconds=seconds))
        row.refresh_from_db()
        return row

    stale = Wait(WaitKind.ADMISSION, "waiting for admission")
    other = make_world("initech").tenant
    suspended = make_world("umbrella").tenant
    Tenant.objects.filter(pk=suspended.pk).update(suspended_at=timezone.now())
    blocker = queued("blocker", world.tenant, 10)
    passed_over = queued("passed-over", other, 5, label=stale)  # earlier, another tenant
    behind = queued("behind", world.tenant, 20, label=stale)
    held = queued("held", suspended, 30, label=stale)
    current = queued("current", world.tenant, 40)  # labelled right already: not read

    rest = queued_in_order().exclude(pk=blocker.pk)
    with CaptureQueriesContext(connection) as captured:
        _hold_rest(rest, {pools.a100.pk: blocker})
    reads = [q for q in captured.captured_queries if q["sql"].startswith("SELECT")]
    writes = [q for q in captured.captured_queries if q["sql"].startswith("UPDATE")]
    assert (len(reads), len(writes)) == (1, 3)
    labels = dict(Job.objects.values_list("pk", "wait_kind"))
    assert labels[passed_over.pk] == WaitKind.FAIR_SHARE
    assert labels[behind.pk] == labels[current.pk] == WaitKind.POOL_QUEUE
    assert labels[held.pk] == WaitKind.SUSPENDED


def test_a_new_critical_job_is_admitted_before_queued_normal_ones_when_it_fits(world, pools):
    submit(world, "running", cpus=2)
    normal = submit(world, "normal", cpus=CPU_POOL_VCPUS)
    assert normal.status == JobStatus.QUEUED
    critical = submit(world, "critical", cpus=2, priority="critical")
    assert critical.status == JobStatus.DISPATCHING
    assert queue_position(normal) == 1
    # A new normal job still queues behind the earlier normal one; a low one too.
    later = submit(world, "later", cpus=1)
    assert (later.status, later.status_reason) == (JobStatus.QUEUED, BEHIND_IN_POOL.message)
    assert later.wait_kind == WaitKind.POOL_QUEUE
    assert queue_position(later) == 2


def test_another_tenants_quota_wait_does_not_block_a_new_job_but_its_own_does(
    world, other_world, pools
):
    TenantQuota.objects.create(tenant=other_world.tenant, max_concurrent_jobs=1)
    submit(other_world, "theirs-running", cpus=1)
    theirs = submit(other_world, "theirs-waiting", cpus=1)
    assert theirs.status_reason == "quota: at most 1 jobs at once"
    assert submit(world, "mine", cpus=1).status == JobStatus.DISPATCHING
    again = submit(other_world, "theirs-again", cpus=1)
    assert (again.status, again.status_reason) == (JobStatus.QUEUED, BEHIND_OWN_QUOTA.message)
    assert (theirs.wait_kind, again.wait_kind) == (WaitKind.QUOTA, WaitKind.QUOTA_QUEUE)
    assert services.jobs_admit() == []
    assert reason(again) == BEHIND_OWN_QUOTA.message


@pytest.mark.parametrize("seed", range(8))
def test_submit_decides_as_a_full_admission_pass_would(world, other_world, pools, seed):
    """Random launches with nothing finishing: after each, a full pass (which sees the
    whole queue) admits nothing more, gives the new job the same reason and position, and
    agrees on which jobs wait behind others."""
    rng = random.Random(seed)
    TenantQuota.objects.create(tenant=other_world.tenant, max_concurrent_jobs=2)
    waits_behind = {WaitKind.POOL_QUEUE, WaitKind.QUOTA_QUEUE}
    for number in range(14):
        owner = rng.choice([world, other_world])
        spec = {"cpus": rng.choice([1, 2, 3]), "priority": rng.choice(PRIORITY_NAMES)}
        if rng.random() < 0.3:
            spec |= {"nodes": 2, "spot_ratio": Decimal("0.5"), "cpus": rng.choice([1, 2])}
        elif rng.random() < 0.2:
            spec |= {"gpu_type": "h100-80gb", "gpus_per_node": rng.choice([2, 4, 8])}
            spec["cpus"] = None
        new = submit(owner, f"job-{number}", **spec)
        position = queue_position(new)
        behind = set(Job.objects.filter(wait_kind__in=waits_behind).values_list("pk"))
        assert services.jobs_admit() == []
        assert (reason(new), queue_position(new)) == (new.status_reason, position)
        assert set(Job.objects.filter(wait_kind__in=waits_behind).values_list("pk")) == behind


# --- refused at submit -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"cpus": CPU_POOL_VCPUS + 1}, "cpus", "4 vCPUs in all; 5 asked"),
        (
            {"gpu_type": "h100-80gb", "gpus_per_node": 16, "cpus": None},
            "gpus_per_node",
            "8 GPUs per node; 16 asked",
        ),
        (
            {"gpu_type": "h100-80gb", "gpus_per_node": 8, "nodes": 2, "cpus": None},
            "nodes",
            "8 GPUs in all; 16 asked",
        ),
    ],
    ids=["cpus-over-pool", "gpus-per-node-over-pool", "gpus-over-pool"],
)
def test_request_larger_than_the_pool_is_refused_at_submit(world, pools, spec, field, message):
    with pytest.raises(ServiceError) as refused:
        submit(world, "too big", **spec)
    assert refused.value.field == field
    assert message in refused.value.message
    assert not Job.objects.exists()


@pytest.mark.parametrize("scoped_to_type", [True, False], ids=["per-type", "tenant-wide"])
def test_request_larger_than_the_quota_is_refused_at_submit(world, pools, scoped_to_type):
    gpu_type = GpuType.objects.get(slug="h100-80gb") if scoped_to_type else None
    TenantQuota.objects.create(tenant=world.tenant, gpu_type=gpu_type, max_gpus=4)
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, gpus=6)
    assert refused.value.field == "nodes"
    assert "quota allows at most 4 GPUs" in refused.value.message
    assert not Job.objects.exists()


# --- state machine -------------------------------------------------------------------------


def _job_in(world, status: str) -> Job:
    """A fresh job of `world` brought to `status` by the shortest legal path."""
    job = JobFactory(tenant=world.tenant)
    return job if status == JobStatus.QUEUED else advance_to(job, status, actor=SYSTEM)


ALL_PAIRS = list(product(JobStatus.values, JobStatus.values))


def test_every_pair_outside_the_table_is_refused_and_writes_nothing(world, pools):
    illegal = [(a, b) for a, b in ALL_PAIRS if b not in TRANSITIONS[a]]
    assert len(illegal) > len(ALL_PAIRS) / 2
    for current, to in illegal:
        job = _job_in(world, current)
        events = JobEvent.objects.count()
        with pytest.raises(IllegalTransition) as refused:
            job_transition(job=job, to=to, actor=SYSTEM, reason="try")
        assert refused.value.code == "conflict"
        job.refresh_from_db()
        assert (job.status, JobEvent.objects.count()) == (current, events), (current, to)


def test_every_pair_in_the_table_writes_exactly_one_event(world, pools):
    legal = [(a, b) for a, b in ALL_PAIRS if b in TRANSITIONS[a]]
    assert set(TRANSITIONS) == set(JobStatus.values)
    for current, to in legal:
        job = _job_in(world, current)
        before = set(JobEvent.objects.filter(job=job).values_list("pk", flat=True))
        job_transition(job=job, to=to, actor=SYSTEM, reason=f"{current}->{to}")
        new = JobEvent.objects.filter(job=job).exclude(pk__in=before)
        assert [(e.from_status, e.to_status, e.actor, e.reason) for e in new] == [
            (current, to, "system", f"{current}->{to}")
        ]
        job.refresh_from_db()
        assert (job.status, job.status_reason) == (to, f"{current}->{to}")


def test_finished_states_are_final_and_expected_from_is_checked(world, pools):
    job = submit(world)
    for final in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
        assert TRANSITIONS[final] == frozenset()
    assert job.status == JobStatus.DISPATCHING
    with pytest.raises(IllegalTransition):
        job_transition(
            job=job,
            to=JobStatus.RUNNING,
            actor=SYSTEM,
            expected_from=frozenset({JobStatus.PROVISIONING}),
        )
    job_transition(
        job=job,
        to=JobStatus.RUNNING,
        actor=SYSTEM,
        expected_from=frozenset({JobStatus.DISPATCHING}),
    )
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.started_at is not None
    assert JobStatus.RUNNING in HOLDING_COMPUTE


# --- spot placement ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "ratio", "spot"),
    [
        (1, "0", 0),
        (1, "0.499", 0),
        (1, "0.5", 1),
        (1, "1", 1),
        (2, "0.25", 1),
        (3, "0.5", 2),
        (4, "0.3", 1),
        (4, "0.375", 2),
        (5, "0.7", 4),
        (10, "0.05", 1),
        (10, "0.049", 0),
        (10, "1", 10),
    ],
)
def test_spot_nodes_are_nodes_times_ratio_rounded_half_up(nodes, ratio, spot):
    assert node_split(nodes=nodes, spot_ratio=Decimal(ratio)).spot_nodes == spot


@given(
    nodes=st.integers(min_value=1, max_value=1024),
    ratio=st.decimals(min_value=0, max_value=1, places=3),
)
def test_spot_nodes_stay_within_the_job(nodes, ratio):
    spot = node_split(nodes=nodes, spot_ratio=ratio).spot_nodes
    assert 0 <= spot <= nodes
    assert abs(Decimal(spot) - nodes * ratio) <= Decimal("0.5")


def test_spot_ratio_splits_the_job_between_the_tiers(world, pools):
    single = submit(world, "single", spot_ratio=Decimal("0.5"))
    assert (single.spot_nodes, single.on_demand_nodes) == (1, 0)
    assert (single.pool, single.spot_pool) == (None, pools.cpu_spot)

    split = submit(world, "split", nodes=3, spot_ratio=Decimal("0.5"))
    assert (split.spot_nodes, split.on_demand_nodes) == (2, 1)
    assert (split.pool, split.spot_pool) == (pools.cpu, pools.cpu_spot)

    on_demand = submit(world, "on-demand", nodes=2, spot_ratio=Decimal("0.2"))
    assert (on_demand.spot_nodes, on_demand.on_demand_nodes) == (0, 2)
    assert on_demand.spot_pool is None


def test_admission_counts_both_tiers_of_a_split_job(world, pools):
    # 2 spot + 1 on-demand nodes × 2 vCPUs: 4 of the spot pool, 2 of the on-demand one.
    split = submit(world, "split", nodes=3, cpus=2, spot_ratio=Decimal("0.5"))
    assert split.status == JobStatus.DISPATCHING
    spot_only = submit(world, "spot", cpus=1, spot_ratio=Decimal("1"))
    assert spot_only.status == JobStatus.QUEUED
    assert spot_only.status_reason == f"waiting for 1 vCPUs in {pools.cpu_spot.name} (0 free)"
    assert submit(world, "on-demand", cpus=2).status == JobStatus.DISPATCHING


def test_spot_ratio_without_a_spot_pool_is_refused(world, pools):
    with pytest.raises(ServiceError) as refused:
        gpu_job(world, gpus=1, spot_ratio=Decimal("0.5"))
    assert refused.value.field == "spot_ratio"


def test_a_suspension_after_the_launch_check_holds_the_job_back_at_admission(world, pools):
    # world.tenant is the launch's view of the organisation from before the suspension;
    # admission reads the row again once the pool is locked, and sees it.
    Tenant.objects.filter(pk=world.tenant.pk).update(
        suspended_at=timezone.now(), suspension_reason="unpaid invoice"
    )
    job = submit(world, "late", cpus=1)
    assert (job.status, job.wait_kind) == (JobStatus.QUEUED, WaitKind.SUSPENDED)
    assert not Job.objects.filter(status__in=HOLDING_COMPUTE).exists()


def test_a_launch_that_waits_relabels_a_later_launch_it_went_before(world, pools):
    # Two concurrent launches: the later one (created after) took the pool lock first and
    # was decided without seeing the earlier one. The earlier one's pass then says what
    # holds the later one now, as a full pass would, and stops there.
    gpu_job(world, "holder", gpus=8)
    later = gpu_job(world, "later", gpus=8)
    assert later.wait_kind == WaitKind.CAPACITY
    Job.objects.filter(pk=later.pk).update(created_at=timezone.now() + timedelta(seconds=5))
    earlier = gpu_job(world, "earlier", gpus=8)
    later.refresh_from_db()
    assert (earlier.status, earlier.wait_kind) == (JobStatus.QUEUED, WaitKind.CAPACITY)
    assert (later.status, later.wait_kind) == (JobStatus.QUEUED, WaitKind.POOL_QUEUE)
    assert services.jobs_admit() == []
    later.refresh_from_db()
    assert later.wait_kind == WaitKind.POOL_QUEUE


def test_a_higher_priority_launch_that_waits_relabels_the_jobs_it_went_before(world, pools):
    gpu_job(world, "holder", gpus=8)
    normal = gpu_job(world, "normal", gpus=8)
    assert normal.wait_kind == WaitKind.CAPACITY
    critical = gpu_job(world, "critical", gpus=8, priority="critical")
    normal.refresh_from_db()
    assert (critical.status, critical.wait_kind) == (JobStatus.QUEUED, WaitKind.CAPACITY)
    assert (normal.status, normal.wait_kind) == (JobStatus.QUEUED, WaitKind.POOL_QUEUE)
