"""Dispatch is at-least-once in delivery and exactly-once in effect (DESIGN.md, "Reliability
model"): a Celery worker killed with SIGKILL while its Kubernetes Job create is in flight
leaves the task unacknowledged; Redis redelivers it after the visibility timeout (and the
sweep takes its own claims again), or the reconciler queues a sweep that takes the job
once the dead sweep's claim lapses; and the deterministic Job names plus "409 is
success" make the second run finish the launch without a second Job, whichever of the two
creates reaches the API server first.

Real processes throughout: `celery worker --pool prefork --concurrency 1` (as in
production) against the test database and the session's Redis, talking HTTP to the fake
Kubernetes API server that runs in this process.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs import services
from jobs.backends.kubernetes import KubernetesBackend
from jobs.models import Job, JobStatus
from jobs.services import JobSpec
from marketplace.demo import seed_catalog
from marketplace.models import NodePool
from marketplace.services import capacity_sync
from tests.concurrency import run_at_once
from tests.integration.helpers import (
    WorkerProcess,
    forget_abandoned_messages,
    start_worker_process,
)
from tests.servers import child_env, purge_queues, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

VISIBILITY_TIMEOUT = 5  # seconds; production keeps Celery's hour (the reconciler is faster)
CLAIM_SECONDS = 2
JOB_CREATE = r"^/apis/batch/v1/namespaces/[^/]+/jobs$"
H100 = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "topology.kubernetes.io/region": "us-west",
}


# --- processes ------------------------------------------------------------------------------


@pytest.fixture
def start_worker(transactional_db, tmp_path) -> Iterator[Callable[..., list[WorkerProcess]]]:
    """Starts real prefork Celery workers (concurrency 1, as in production) with the
    Kubernetes backend at settings.KUBECONFIG and a short visibility timeout; each leads
    its own process group, and every group is SIGKILLed at the end."""
    from django.conf import settings

    purge_queues()  # earlier tests may have left messages on this session's queue
    started: list[WorkerProcess] = []

    def start(count: int = 1) -> list[WorkerProcess]:
        batch = []
        for _ in range(count):
            number = len(started) + 1
            worker = start_worker_process(
                f"dispatch-{number}-{os.getpid()}",
                tmp_path / f"worker-{number}.log",
                child_env(
                    COMPUTE_BACKENDS="kubernetes",
                    KUBECONFIG=settings.KUBECONFIG,  # as the test set it
                    CELERY_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT),
                    KUBERNETES_REQUEST_TIMEOUT="20",  # longer than any hang below
                    # A killed sweep's claim lapses this soon (production: a minute).
                    DISPATCH_CLAIM_SECONDS=str(CLAIM_SECONDS),
                ),
            )
            started.append(worker)
            batch.append(worker)
        for worker in batch:
            wait_until(
                lambda w=worker: w.exited() or w.ready(),
                60,
                what="celery worker ready",
            )
            if worker.exited():
                raise AssertionError(f"celery worker exited early:\n{worker.log()}")
        return batch

    try:
        yield start
    finally:
        for worker in started:  # signal every group first, then reap and check each
            worker.signal_group()
        for worker in started:
            worker.kill_group()
        purge_queues()
        forget_abandoned_messages(settings.CELERY_TASK_DEFAULT_QUEUE, settings.REDIS_URL)


# --- cluster and job ------------------------------------------------------------------------


@pytest.fixture
def cluster(transactional_db, kube_api, settings, tmp_path):
    """An on-demand and a spot H100 node in us-west, synced into pools; this process and
    the workers reach the fake API server through the same kubeconfig."""
    seed_catalog()
    NodePool.objects.filter(slug__startswith="demo-").update(is_active=False)
    kube_api.add_node("h100-od-1", labels=H100)
    kube_api.add_node(
        "h100-spot-1",
        labels={**H100, "gpugeek.io/tier": "spot"},
        taints=[{"key": "gpugeek.io/spot", "value": "true", "effect": "NoSchedule"}],
    )
    capacity_sync(backend=KubernetesBackend(kube_api.api_client()))
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    settings.KUBECONFIG = str(kube_api.kubeconfig_path(tmp_path))
    settings.KUBERNETES_REQUEST_TIMEOUT = 20
    return kube_api


def launch_two_tier_job(world) -> Job:
    """One on-demand and one spot node: an attempt is two Kubernetes Jobs."""
    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=JobSpec(
            name="train",
            image="pytorch-2-5-cuda12-4",
            command=["torchrun", "train.py"],
            gpu_type="h100-80gb",
            gpus_per_node=8,
            cpus=16,
            nodes=2,
            spot_ratio=Decimal("0.5"),
            region="us-west",
        ),
    )
    assert job.status == JobStatus.DISPATCHING, job.status_reason
    return job


def kube_jobs(cluster, job: Job) -> dict[str, str]:
    """name → uid of the Kubernetes Jobs of `job` (a re-created Job gets a new uid)."""
    return {
        item["metadata"]["name"]: item["metadata"]["uid"]
        for item in cluster.list("jobs", f"gg-t-{job.tenant_id}")
        if item["metadata"].get("labels", {}).get("gpugeek.io/job") == str(job.pk)
    }


def job_creates(cluster) -> list:
    return [
        r for r in list(cluster.requests) if r.method == "POST" and re.match(JOB_CREATE, r.path)
    ]


def provisioning_events(job: Job) -> int:
    return job.events.filter(to_status=JobStatus.PROVISIONING).count()


def wait_for_status(
    job: Job, status: str, workers: list[WorkerProcess], timeout: float = 30
) -> Job:
    def reached() -> bool:
        job.refresh_from_db()
        return job.status == status

    try:
        wait_until(reached, timeout, what=f"job {job.pk} {status}")
    except AssertionError as error:
        logs = "\n".join(f"--- {w.log_path.name}\n{w.log()}" for w in workers)
        raise AssertionError(f"{error}; it is {job.status} ({job.status_reason})\n{logs}") from None
    return job


# --- tests ----------------------------------------------------------------------------------


def test_worker_killed_mid_create_is_redelivered_and_ends_with_one_job_per_tier(
    cluster, world, start_worker
):
    """Whole worker group SIGKILLed while the on-demand Job create hangs; the hung create
    lands while no worker is alive; after the visibility timeout Redis hands the same task
    to a new worker, whose create meets the existing Job (409) and records the launch."""
    cluster.delay_next("POST", JOB_CREATE, 3)  # the first Job create only
    [first] = start_worker()
    job = launch_two_tier_job(world)  # transactional test: on_commit really enqueues

    wait_until(lambda: job_creates(cluster), 30, what="the Job create in flight")
    hung_at = time.monotonic()
    first.kill_group()
    [original_task] = first.received()
    job.refresh_from_db()
    assert job.status == JobStatus.DISPATCHING  # the killed worker never recorded the launch

    # The server finishes what the dead client began: the on-demand Job exists, the spot
    # one was never asked for.
    late = wait_until(lambda: kube_jobs(cluster, job), 10, what="the hung create landing")
    assert list(late) == [f"gg-{job.pk}-a1"]

    # A worker starting after the visibility timeout sweeps the abandoned task back.
    time.sleep(max(0.0, hung_at + VISIBILITY_TIMEOUT + 0.5 - time.monotonic()))
    [second] = start_worker()
    job = wait_for_status(job, JobStatus.PROVISIONING, [first, second])

    assert second.received() == [original_task]  # redelivered, not re-enqueued
    created = kube_jobs(cluster, job)
    assert sorted(created) == [f"gg-{job.pk}-a1", f"gg-{job.pk}-a1-spot"]
    assert created[f"gg-{job.pk}-a1"] == late[f"gg-{job.pk}-a1"]  # kept, not replaced
    assert provisioning_events(job) == 1


def test_reconciler_redispatches_killed_dispatch_and_late_create_adds_no_job(
    cluster, world, start_worker
):
    """Two workers are up; the one that got the dispatch is SIGKILLed mid-create. The
    survivor has already swept for abandoned tasks (kombu does it at start, then rarely),
    so the reconciler re-enqueues the stuck dispatch; the survivor launches the job, and
    the hung create, landing afterwards, meets the existing Job (409)."""
    hang_seconds = 10
    cluster.delay_next("POST", JOB_CREATE, hang_seconds)
    workers = start_worker(count=2)
    job = launch_two_tier_job(world)

    wait_until(lambda: job_creates(cluster), 30, what="the Job create in flight")
    hung_at = time.monotonic()
    [(victim, [original_task])] = [(w, w.received()) for w in workers if w.received()]
    [survivor] = [w for w in workers if w is not victim]
    victim.kill_group()
    job.refresh_from_db()
    assert job.status == JobStatus.DISPATCHING
    assert kube_jobs(cluster, job) == {}  # the create is still hanging
    # The dead sweep's claim on the job lapses; then the reconciler's sweep may take it.
    wait_until(
        lambda: Job.objects.filter(pk=job.pk, dispatch_claimed_until__lt=timezone.now()).exists(),
        CLAIM_SECONDS + 5,
        what="the killed sweep's claim to lapse",
    )

    assert services.jobs_reconcile(stuck_after_seconds=0) == [job.pk]
    job = wait_for_status(job, JobStatus.PROVISIONING, workers)
    assert time.monotonic() < hung_at + hang_seconds, "the reconciler was slower than the hang"
    created = kube_jobs(cluster, job)
    assert sorted(created) == [f"gg-{job.pk}-a1", f"gg-{job.pk}-a1-spot"]
    [reconciler_task] = survivor.received()
    assert reconciler_task != original_task

    # Let the hung create land: it must meet the Job the survivor made, not add or replace one.
    time.sleep(max(0.0, hung_at + hang_seconds + 0.5 - time.monotonic()))
    assert kube_jobs(cluster, job) == created
    assert len([r for r in job_creates(cluster) if f'"gg-{job.pk}-a1"' in r.body]) == 2
    job.refresh_from_db()
    assert job.status == JobStatus.PROVISIONING
    assert provisioning_events(job) == 1


def test_two_concurrent_dispatches_create_one_job_per_tier(cluster, world):
    """Two deliveries of the same dispatch race (e.g. a redelivery while the first worker
    is only slow): both creates reach the API server together; one Job per tier results
    and the job is recorded as launched once."""
    job = launch_two_tier_job(world)
    # Hold both on-demand creates so the two dispatches are in flight at the same time.
    cluster.delay_next("POST", JOB_CREATE, 1.0, times=2)
    run_at_once(lambda: services.job_dispatch(job=Job.objects.get(pk=job.pk)))

    job.refresh_from_db()
    assert job.status == JobStatus.PROVISIONING
    assert sorted(kube_jobs(cluster, job)) == [f"gg-{job.pk}-a1", f"gg-{job.pk}-a1-spot"]
    on_demand_creates = [r for r in job_creates(cluster) if f'"gg-{job.pk}-a1"' in r.body]
    assert len(on_demand_creates) == 2  # both really raced to create the same Job
    assert provisioning_events(job) == 1
