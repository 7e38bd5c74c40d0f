"""Fault injection (issue 15, test 2): Redis restarted during 500 submissions. Every job
reaches the backend (its Kubernetes Job exists) once the reconciler has re-enqueued what
the broker lost, none twice, and none stays in `dispatching` for two minutes (here all
are dispatched within a minute of the last submission).

The test runs a Redis of its own (never the shared one: other sessions' queues live
there) as the broker and channel layer of this process and of a real prefork Celery
worker. Jobs are submitted through the API (`POST /api/v1/jobs`, each with its own
Idempotency-Key, as a careful client sends them). A while before the kill the simulated
Kubernetes API server turns slow to create Jobs, so the worker falls behind and messages
queue up in Redis. At a random submission the test SIGKILLs Redis (nothing persisted:
every queued message is gone, and so is the acknowledgement of the task the worker was
running), keeps submitting while it is down (those dispatches can't be queued at all),
and starts it again on the same port. What is then missing is redone by the reconciler
(`jobs_reconcile`, the beat's job, run here by the test whenever the queue has drained).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from jobs import services
from jobs.backends.kubernetes import KubernetesBackend
from jobs.models import Job, JobEvent, JobStatus
from marketplace.demo import seed_catalog
from marketplace.models import NodePool
from marketplace.services import capacity_sync
from tests.conftest import token_client
from tests.faults.helpers import (
    ApiTally,
    OwnRedis,
    Workers,
    celery_broker,
    queue_length,
    report_counts,
    worker_env,
)
from tests.integration.helpers import unacked_tags
from tests.servers import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.timeout(170),
    pytest.mark.django_db(transaction=True),
]

SUBMISSIONS = 500
KILL_BETWEEN = (150, 300)  # Redis is killed before a random submission in this range
OUTAGE_SECONDS = 2.0  # submissions go on meanwhile, each failing to queue its dispatch
STUCK_AFTER = 3  # seconds in `dispatching` before the reconciler redoes a dispatch
SLOW_BEFORE_KILL = 80  # submissions before the kill during which Job creates are slow
CREATE_SECONDS = 0.15  # how long the simulated API server then holds each Job create
DRAIN_SECONDS = 60  # after the last submission, for every job to reach the backend
STUCK_LIMIT = 120  # seconds: the bound on any job's time in `dispatching`
CPU_NODES = 4  # 128 vCPUs each: room for every one-vCPU job at once
US_WEST = {"topology.kubernetes.io/region": "us-west"}


@pytest.fixture
def own_redis(tmp_path):
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def cluster(kube_api, settings, tmp_path):
    """CPU nodes in us-west, synced into a pool. The simulated controllers are paused: a
    Job that exists is what this test asks for, and 500 Jobs' pods would only cost time."""
    seed_catalog()
    NodePool.objects.filter(slug__startswith="demo-").update(is_active=False)
    for n in range(CPU_NODES):
        kube_api.add_node(f"cpu-{n}", labels=US_WEST, allocatable={"cpu": "128", "memory": "2Ti"})
    capacity_sync(backend=KubernetesBackend(kube_api.api_client()))
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    settings.KUBECONFIG = str(kube_api.kubeconfig_path(tmp_path))
    settings.KUBERNETES_REQUEST_TIMEOUT = 20
    with kube_api.paused():
        yield kube_api


@pytest.fixture
def on_own_redis(own_redis, settings):
    """This process's broker and channel layer on the test's own Redis."""
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    layers["default"]["CONFIG"]["hosts"][0]["address"] = own_redis.url
    settings.CHANNEL_LAYERS = layers  # channels drops its cached layer on this change
    settings.REDIS_URL = own_redis.url
    with celery_broker(own_redis.url):
        yield own_redis


@pytest.fixture
def worker(cluster, on_own_redis, tmp_path):
    workers = Workers(tmp_path, **worker_env(REDIS_URL=on_own_redis.url))
    try:
        yield workers.start_ready()
    finally:
        workers.stop_all()


def job_request(number: int) -> dict:
    return {
        "name": f"etl-{number}",
        "image": "python-3.11",
        "command": ["python", "-c", "pass"],
        "cpus": 1,
        "region": "us-west",
    }


def drained(redis_server: OwnRedis) -> bool:
    """Nothing waiting in the broker, nothing delivered and not yet acknowledged."""
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    client = redis_server.client()
    try:
        return not queue_length(client, queue) and not unacked_tags(client, queue)
    finally:
        client.close()


def waiting(redis_server: OwnRedis) -> int:
    client = redis_server.client()
    try:
        return queue_length(client, settings.CELERY_TASK_DEFAULT_QUEUE)
    finally:
        client.close()


def test_redis_restart_during_submissions_loses_no_job(
    cluster, on_own_redis, worker, world, caplog
):
    redis_server = on_own_redis
    # Live updates fail while Redis is down, as they should (quietly): not worth a
    # traceback per submission in the report.
    caplog.set_level(logging.ERROR, logger="jobs.realtime.sender")
    seed = random.randrange(1 << 32)
    kill_before = random.Random(seed).randrange(*KILL_BETWEEN)
    api_tally = ApiTally(cluster)
    slow_from = kill_before - SLOW_BEFORE_KILL
    client = token_client(world.member, world.tenant)
    started = time.monotonic()
    killed_at = back_at = None
    submitted_while_down = queued_at_kill = 0

    for number in range(SUBMISSIONS):
        if number == slow_from:
            # For a while the cluster's API is slow to create Jobs: the worker falls
            # behind, and the restart has queued dispatches to lose.
            cluster.slow_fraction(1.0, 600, CREATE_SECONDS, method="POST", path_regex="/jobs$")
        if number == kill_before:
            queued_at_kill = waiting(redis_server)
            redis_server.kill()
            killed_at = time.monotonic()
            cluster.clear_faults()
        if back_at is None and killed_at and time.monotonic() - killed_at >= OUTAGE_SECONDS:
            redis_server.start()
            back_at = time.monotonic()
        submitted_while_down += killed_at is not None and back_at is None
        response = client.post(
            "/api/v1/jobs",
            job_request(number),
            format="json",
            HTTP_IDEMPOTENCY_KEY=f"etl-{seed}-{number}",
        )
        assert response.status_code == 201, response.content
    submitted = time.monotonic()
    assert back_at is not None

    # The worker drains what Redis still has; whenever the queue is empty while jobs are
    # still waiting to be dispatched, the reconciler re-enqueues them.
    redone: set[int] = set()
    reconcile_seconds = 0.0

    def all_dispatched() -> bool:
        nonlocal reconcile_seconds
        if not Job.objects.filter(status=JobStatus.DISPATCHING).exists():
            return drained(redis_server)  # and no redone dispatch is left to run
        if drained(redis_server):
            stuck_before = timezone.now() - timedelta(seconds=STUCK_AFTER)
            stuck = Job.objects.filter(
                status=JobStatus.DISPATCHING, status_changed_at__lt=stuck_before
            )
            stuck_ids = set(stuck.values_list("pk", flat=True))
            began = time.monotonic()
            redone.update(stuck_ids & set(services.jobs_reconcile(stuck_after_seconds=STUCK_AFTER)))
            reconcile_seconds += time.monotonic() - began
        return False

    with contextlib.suppress(AssertionError):  # what is still stuck is counted below
        wait_until(all_dispatched, DRAIN_SECONDS, 0.5, "every job dispatched")
    dispatched = time.monotonic()

    jobs = list(Job.objects.order_by("pk"))
    created = api_tally.job_creates()
    listed = {item["metadata"]["name"] for item in cluster.list("jobs", f"gg-t-{world.tenant.pk}")}
    launches = Counter(
        JobEvent.objects.filter(to_status=JobStatus.PROVISIONING).values_list("job_id", flat=True)
    )
    lost = sum(
        1 for job in jobs if f"gg-{job.pk}-a1" not in listed or job.status != JobStatus.PROVISIONING
    )
    doubled = (
        max(0, len(jobs) - SUBMISSIONS)
        + sum(n - 1 for n in created.values())
        + sum(n - 1 for n in launches.values())
    )
    stuck = sum(1 for job in jobs if job.status == JobStatus.DISPATCHING)
    # How long each job spent in `dispatching`: from its admission to its launch.
    entered = dict(
        JobEvent.objects.filter(to_status=JobStatus.DISPATCHING)
        .values_list("job_id")
        .annotate(at=Max("at"))
    )
    left = {
        event.job_id: event.at
        for event in JobEvent.objects.filter(to_status=JobStatus.PROVISIONING)
    }
    waits = [(left[pk] - entered[pk]).total_seconds() for pk in left if pk in entered]
    not_queued = sum(
        1 for r in caplog.records if r.name == "console.queueing" and "could not queue" in r.msg
    )
    report_counts(
        "redis-restart",
        trials=SUBMISSIONS,
        lost=lost,
        doubled=doubled,
        stuck=stuck,
        killed_before=kill_before,
        queued_at_kill=queued_at_kill,
        submitted_while_down=submitted_while_down,
        not_queued=not_queued,
        redone_by_reconciler=len(redone),
        max_dispatching_seconds=max(waits, default=0.0),
        all_dispatched_after_redis_back=dispatched - back_at,
        reconcile_seconds=reconcile_seconds,
        submit_seconds=submitted - started,
        seconds=time.monotonic() - started,
    )
    assert len(jobs) == SUBMISSIONS
    assert (lost, doubled, stuck) == (0, 0, 0), worker.log()[-5000:]
    assert len(waits) == SUBMISSIONS and max(waits) < STUCK_LIMIT
    # Launches went on while Redis was down (or the test proved nothing). Whatever their
    # sends left undone, the next sweep redid: a later launch's (it takes every due row),
    # a resent one's, or the reconciler's.
    assert submitted_while_down
    assert sorted(created) == sorted(listed) == sorted(f"gg-{job.pk}-a1" for job in jobs)
