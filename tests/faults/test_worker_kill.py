"""Fault injection (issue 15, test 1): Celery workers SIGKILLed, whole process group, at
random points of dispatch, 50 times: exactly one Kubernetes Job per (job, attempt, tier),
and every job leaves `dispatching`.

Real prefork workers (concurrency 1, as in production) against the test database and the
session's Redis create Jobs over HTTP on the simulated API server in this process, which
holds a quarter of the Job creates for a while (so that some creates land after their
client died). Each trial hands the workers a dispatch (a new job, or the stuck ones the
reconciler redoes), waits until a worker has received it, and kills that worker's group
at a random point of the dispatch: after a random number (0–12) of the API requests a
dispatch makes (namespace set-up, Service, the on-demand and the spot Job), or once the
task has ended, plus a few random milliseconds. Workers come from a fork server, and
the next ones are already starting meanwhile, so a trial costs a fork, not a new
interpreter.

What was cut short is redone the two ways production redoes it: Redis hands an
unacknowledged task to a worker once the (short) visibility timeout has passed, and the
reconciler (`jobs_reconcile`, the beat's job, run here by the test) queues a sweep for
jobs stuck in `dispatching` (it takes them once the dead sweep's claims lapse). Both may
run a dispatch that already happened, or run it twice at once; deterministic names and
"409 is done" must make that harmless.
"""

from __future__ import annotations

import contextlib
import random
import re
import time
from collections import Counter
from datetime import timedelta
from decimal import Decimal

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from jobs import services
from jobs.backends.kubernetes import KubernetesBackend
from jobs.models import Job, JobStatus
from jobs.services import JobSpec
from marketplace.demo import seed_catalog
from marketplace.models import NodePool
from marketplace.services import capacity_sync
from tests.faults.helpers import ApiTally, Workers, queue_length, report_counts, worker_env
from tests.integration.helpers import (
    DISPATCH_TASK,
    WorkerProcess,
    forget_abandoned_messages,
    unacked_tags,
)
from tests.servers import purge_queues, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.timeout(150),
    pytest.mark.django_db(transaction=True),
]

TRIALS = 50  # kills, each of a worker that has just received a dispatch
# A dispatch by a fresh worker makes 12 API requests (9 to check the namespace's set-up,
# the Service, then one Job per tier). A kill point is a number of them (0–12) or, past
# that, the end of the task.
KILL_POINTS = 14
JITTER = 0.03  # seconds, random, after the kill point is reached
# How often the test looks at the workers' logs and the request count: more often would
# take the CPU from the API server in this process and slow the dispatches it watches.
POLL = 0.01
VISIBILITY_TIMEOUT = 3  # seconds (production: an hour; the reconciler is faster there)
STUCK_AFTER = 1.0  # seconds in `dispatching` before the test's reconciler redoes it
SETTLE_SECONDS = 30  # after the kills, for every job to leave `dispatching`
MAX_JOBS = 60
LIVE_WORKERS = 3  # the next victim and two starting: a worker start is the slow part
NODES_PER_TIER = 8  # 8 GPUs each: 64 one-GPU ranks per tier, more than MAX_JOBS
LAUNCHED = {JobStatus.PROVISIONING, JobStatus.RUNNING}
TASK_ENDED = re.compile(rf"Task {DISPATCH_TASK}\[[0-9a-f-]+\] (?:succeeded|retry|raised)")
H100 = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "topology.kubernetes.io/region": "us-west",
}


@pytest.fixture
def cluster(kube_api, settings, tmp_path):
    """Eight on-demand and eight spot H100 nodes in us-west, synced into pools; the test
    and its workers reach the simulated API server through the same kubeconfig. The
    simulated controllers are paused: Jobs are what this test counts, and their pods'
    simulated workloads would only take the CPU from the API server."""
    seed_catalog()
    NodePool.objects.filter(slug__startswith="demo-").update(is_active=False)
    for n in range(NODES_PER_TIER):
        kube_api.add_node(f"h100-od-{n}", labels=H100)
        kube_api.add_node(
            f"h100-spot-{n}",
            labels={**H100, "gpugeek.io/tier": "spot"},
            taints=[{"key": "gpugeek.io/spot", "value": "true", "effect": "NoSchedule"}],
        )
    capacity_sync(backend=KubernetesBackend(kube_api.api_client()))
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    settings.KUBECONFIG = str(kube_api.kubeconfig_path(tmp_path))
    settings.KUBERNETES_REQUEST_TIMEOUT = 20
    with kube_api.paused():
        yield kube_api


@pytest.fixture
def workers(cluster, tmp_path):
    purge_queues()  # earlier tests may have left messages on this queue
    pool = Workers(
        tmp_path,
        forked=True,
        **worker_env(
            CELERY_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT),
            # A killed sweep's claims lapse this soon, for the reconciler's sweep.
            DISPATCH_CLAIM_SECONDS="1",
        ),
    )
    try:
        yield pool
    finally:
        pool.stop_all()
        purge_queues()
        forget_abandoned_messages(settings.CELERY_TASK_DEFAULT_QUEUE, settings.REDIS_URL)


def launch(world, number: int) -> Job:
    """Two nodes of one H100, one of them on spot: an attempt is two Kubernetes Jobs, so
    a kill can also land between the tiers' creates."""
    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=JobSpec(
            name=f"train-{number}",
            image="pytorch-2-5-cuda12-4",
            command=["torchrun", "train.py"],
            gpu_type="h100-80gb",
            gpus_per_node=1,
            cpus=4,
            nodes=2,
            spot_ratio=Decimal("0.5"),
            region="us-west",
        ),
    )
    assert job.status == JobStatus.DISPATCHING, job.status_reason
    return job


def dispatch_received(workers: Workers, seen: dict[WorkerProcess, int]) -> WorkerProcess | None:
    """The live worker that received a dispatch since `seen` was taken, if any."""
    for worker in workers.live:
        if len(worker.received()) > seen.get(worker, 0):
            return worker
    return None


def mid_task(worker: WorkerProcess) -> bool:
    """Whether the worker has a task it received and hasn't finished (by its log)."""
    return len(worker.received()) > len(TASK_ENDED.findall(worker.log()))


def progress(job_ids: set[int], api: ApiTally) -> str:
    """How far the dispatch of the one job handed out had got when its worker was killed,
    as the API server and the database show it just after the kill."""
    if len(job_ids) != 1:  # the reconciler handed out several, or a redelivery came
        return "several_jobs" if job_ids else "redelivery"
    [job] = Job.objects.filter(pk__in=job_ids)
    if job.status != JobStatus.DISPATCHING:
        return "launched"
    made = [name for name in api.job_creates() if name.startswith(f"gg-{job.pk}-")]
    return ("no_job", "one_tier", "both_tiers")[len(made)]


def quiet(queue: str) -> bool:
    """No message of `queue` waiting in Redis, and none delivered and not acknowledged."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return not queue_length(client, queue) and not unacked_tags(client, queue)
    finally:
        client.close()


def test_workers_killed_at_random_points_of_dispatch_leave_one_job_per_attempt_and_tier(
    cluster, workers, world
):
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    api = ApiTally(cluster)
    cluster.slow_fraction(0.25, seconds=600, delay=0.25, method="POST", path_regex=r"/jobs$")
    started = time.monotonic()
    jobs: list[Job] = []
    kills = mid_dispatch = reconciled = 0
    outcomes: Counter[str] = Counter()

    while kills < TRIALS:
        assert time.monotonic() - started < 100, f"only {kills} kills in 100 s (seed {seed})"
        while len(workers.live) < LIVE_WORKERS:
            workers.start()
        if not any(w.ready() for w in workers.live):
            time.sleep(0.02)
            continue
        seen = {w: len(w.received()) for w in workers.live}
        # Hand the workers a dispatch: redo those stuck in `dispatching`, as the
        # reconciler does, or else launch a new job.
        stuck_before = timezone.now() - timedelta(seconds=STUCK_AFTER)
        stuck = Job.objects.filter(status=JobStatus.DISPATCHING, status_changed_at__lt=stuck_before)
        handed = set(stuck.values_list("pk", flat=True))
        if handed:  # (the reconciler also looks at jobs still provisioning: not counted)
            handed &= set(services.jobs_reconcile(stuck_after_seconds=STUCK_AFTER))
            reconciled += len(handed)
        elif len(jobs) < MAX_JOBS:
            jobs.append(launch(world, len(jobs) + 1))
            handed = {jobs[-1].pk}
        try:
            victim = wait_until(lambda: dispatch_received(workers, seen), 2, POLL, "a dispatch")
        except AssertionError:
            continue  # nothing to dispatch yet: the killed ones aren't stuck long enough
        after_requests, base = rng.randrange(KILL_POINTS), api.requests
        with contextlib.suppress(AssertionError):  # a dispatch with less to do ends first
            wait_until(
                lambda: api.requests - base >= after_requests or not mid_task(victim),
                3,
                POLL,
            )
        time.sleep(rng.uniform(0, JITTER))
        mid_dispatch += mid_task(victim)
        workers.kill(victim)
        kills += 1
        outcomes[progress(handed, api)] += 1
    kills_done = time.monotonic()

    # Past the visibility timeout, a new worker takes back every delivery the kills left
    # unacknowledged (kombu looks at start); the reconciler redoes what is still stuck.
    time.sleep(max(0.0, kills_done + VISIBILITY_TIMEOUT + 0.5 - time.monotonic()))
    workers.start_ready()

    def settled() -> bool:
        if Job.objects.filter(status=JobStatus.DISPATCHING).exists():
            services.jobs_reconcile(stuck_after_seconds=STUCK_AFTER)
            return False
        return quiet(settings.CELERY_TASK_DEFAULT_QUEUE)  # no late delivery left to run

    with contextlib.suppress(AssertionError):  # what is still stuck is counted below
        wait_until(settled, SETTLE_SECONDS, 0.25, "every job out of dispatching, queue empty")
    workers.stop_all()

    deliveries = Counter(task for w in workers.started for task in w.received())
    created = api.job_creates()
    listed = {
        item["metadata"]["name"]
        for item in cluster.list("jobs", f"gg-t-{world.tenant.pk}")
        if item["metadata"].get("labels", {}).get("gpugeek.io/job")
    }
    lost = doubled = 0
    problems: list[str] = []
    for job in Job.objects.order_by("pk"):
        expected = {f"gg-{job.pk}-a{job.attempt}", f"gg-{job.pk}-a{job.attempt}-spot"}
        ours = {name for name in created if name.startswith(f"gg-{job.pk}-")}
        launches = job.events.filter(to_status=JobStatus.PROVISIONING).count()
        if job.status not in LAUNCHED or ours != expected or not expected <= listed:
            lost += 1
            problems.append(f"job {job.pk}: {job.status} ({job.status_reason}), Jobs {ours}")
        extra = sum(created[name] - 1 for name in ours) + max(0, launches - 1)
        if job.attempt != 1 or extra:
            doubled += 1
            problems.append(f"job {job.pk}: attempt {job.attempt}, {extra} extra creates/launches")
    stuck = Job.objects.filter(status=JobStatus.DISPATCHING).count()
    report_counts(
        "worker-kill",
        trials=kills,
        lost=lost,
        doubled=doubled,
        stuck=stuck,
        jobs=len(jobs),
        killed_mid_dispatch=mid_dispatch,
        redelivered=sum(1 for n in deliveries.values() if n > 1),
        reconciled=reconciled,
        seconds=time.monotonic() - started,
        seed=seed,
    )
    report_counts("worker-kill dispatch progress at kill", **outcomes)
    assert kills >= TRIALS
    assert (lost, doubled, stuck) == (0, 0, 0), "\n".join(problems) + "\n" + workers.logs()
    # The jobs' Jobs and nothing else on the API server: one per attempt and tier, each
    # created once.
    assert len(jobs) == Job.objects.count()
    assert sum(created.values()) == len(listed) == 2 * len(jobs)
