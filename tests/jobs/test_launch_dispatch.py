"""Launches dispatched in batches (jobs.services.launch_dispatch): after commit a launch
lists its job in Redis and queues one sweep unless one waits; the sweep dispatches the
list in batches on the simulated Kubernetes API server, each job exactly once; a sweep
that dies mid-batch has that batch redone by its task's redelivery."""

from __future__ import annotations

import pytest

from console import queueing
from jobs import services, tasks
from jobs.models import Job, JobStatus
from jobs.services import launch_dispatch
from jobs.services.launch_dispatch import ONE_TASK, SWEEP_TASK, dispatch_launched
from tests.jobs import test_kubernetes_lifecycle
from tests.jobs.test_kubernetes_lifecycle import gpu_spec, ns

cluster = test_kubernetes_lifecycle.cluster  # the simulated cluster, shared fixture


class SentTasks:
    """console.queueing.enqueue_now recording what it would send (and whether the broker
    takes it); the test plays the worker."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple]] = []
        self.accepted = True

    def __call__(self, task_name: str, *args) -> bool:
        self.sent.append((task_name, args))
        return self.accepted


@pytest.fixture
def sent(monkeypatch) -> SentTasks:
    recorder = SentTasks()
    monkeypatch.setattr(queueing, "enqueue_now", recorder)
    return recorder


@pytest.fixture(autouse=True)
def empty_list():
    """No listed launch left by another test (they share the test Redis)."""
    client = queueing.broker_redis()
    client.delete(launch_dispatch.pending_key(), launch_dispatch.queued_key())
    yield
    client.delete(launch_dispatch.pending_key(), launch_dispatch.queued_key())


def launch(world, capture, count: int, prefix: str = "l") -> list[Job]:
    jobs = []
    for n in range(count):
        with capture(execute=True):  # its commit's callbacks run
            jobs.append(
                services.job_submit(
                    tenant=world.tenant,
                    user=world.member,
                    spec=gpu_spec(name=f"{prefix}{n}", gpus_per_node=1, cpus=2),
                )
            )
    assert {job.status for job in jobs} == {JobStatus.DISPATCHING}
    return jobs


def listed() -> list[int]:
    return [int(i) for i in queueing.broker_redis().lrange(launch_dispatch.pending_key(), 0, -1)]


def kube_jobs(cluster, job: Job) -> list[str]:
    return sorted(item["metadata"]["name"] for item in cluster.list("jobs", ns(job)))


def test_launches_queue_one_sweep_that_dispatches_them_in_batches(
    world, cluster, sent, settings, django_capture_on_commit_callbacks, monkeypatch
):
    settings.DISPATCH_BATCH_SIZE = 2
    batches = []
    dispatch = launch_dispatch.jobs_dispatch
    monkeypatch.setattr(
        launch_dispatch,
        "jobs_dispatch",
        lambda job_ids: batches.append(job_ids) or dispatch(job_ids=job_ids),
    )
    jobs = launch(world, django_capture_on_commit_callbacks, 5)

    assert sent.sent == [(SWEEP_TASK, ())]  # one sweep for all five
    assert listed() == [job.pk for job in jobs]
    tasks.jobs_dispatch_launched_task.run()

    assert batches == [[jobs[0].pk, jobs[1].pk], [jobs[2].pk, jobs[3].pk], [jobs[4].pk]]
    assert listed() == []
    assert kube_jobs(cluster, jobs[0]) == sorted(f"gg-{job.pk}-a1" for job in jobs)
    assert {job.status for job in Job.objects.filter(pk__in=[j.pk for j in jobs])} == {
        JobStatus.PROVISIONING
    }
    # The sweep started: the next launch queues the next one.
    [late] = launch(world, django_capture_on_commit_callbacks, 1, prefix="late")
    assert sent.sent[1:] == [(SWEEP_TASK, ())] and listed() == [late.pk]


def test_a_sweep_that_died_mid_batch_is_redone_by_its_redelivery(
    world, cluster, sent, settings, django_capture_on_commit_callbacks, monkeypatch
):
    settings.DISPATCH_BATCH_SIZE = 2
    jobs = launch(world, django_capture_on_commit_callbacks, 3)
    dispatch = launch_dispatch.jobs_dispatch

    def dies(job_ids):
        raise SystemExit("the worker is killed")

    monkeypatch.setattr(launch_dispatch, "jobs_dispatch", dies)
    with pytest.raises(SystemExit):
        dispatch_launched(sweep_id="first")
    assert listed() == [jobs[2].pk]  # the first two are claimed by that sweep
    monkeypatch.setattr(launch_dispatch, "jobs_dispatch", dispatch)
    assert dispatch_launched(sweep_id="other") == 1  # another sweep: only what is listed
    assert Job.objects.get(pk=jobs[0].pk).status == JobStatus.DISPATCHING

    assert dispatch_launched(sweep_id="first") == 2  # its redelivery: the claimed batch
    assert dispatch_launched(sweep_id="first") == 0  # delivered once more: nothing left
    assert kube_jobs(cluster, jobs[0]) == sorted(f"gg-{job.pk}-a1" for job in jobs)
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)
    ) == {JobStatus.PROVISIONING}


def test_a_sweep_the_broker_refused_is_queued_again_by_the_next_launch(
    world, cluster, sent, django_capture_on_commit_callbacks
):
    sent.accepted = False  # a broker outage at commit
    first = launch(world, django_capture_on_commit_callbacks, 2)
    assert sent.sent == [(SWEEP_TASK, ()), (SWEEP_TASK, ())]
    assert listed() == [job.pk for job in first]  # listed all the same, for the next sweep


def test_a_launch_falls_back_to_a_task_of_its_own_when_redis_fails(
    world, cluster, sent, django_capture_on_commit_callbacks, monkeypatch
):
    import redis

    monkeypatch.setattr(
        queueing, "broker_redis", lambda: redis.Redis.from_url("redis://127.0.0.1:1/0")
    )
    [job] = launch(world, django_capture_on_commit_callbacks, 1)
    assert sent.sent == [(ONE_TASK, (job.pk,))]


def test_a_launch_on_the_host_keeps_a_task_of_its_own(
    world, catalog, sent, django_capture_on_commit_callbacks
):
    # The host's devices are handed out one dispatch at a time: no batch would help.
    with django_capture_on_commit_callbacks(execute=True):
        job = services.job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=services.JobSpec(name="here", image="python-3.11", command=["true"], cpus=1),
        )
    assert job.status == JobStatus.DISPATCHING and job.backend == "local"
    assert sent.sent == [(ONE_TASK, (job.pk,))] and listed() == []
