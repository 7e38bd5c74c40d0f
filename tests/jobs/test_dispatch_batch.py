"""Batch dispatch (`jobs.services.jobs_dispatch`, run by the sweep `jobs_dispatch_task`):
many admitted jobs started together on the simulated Kubernetes API server, each exactly
once, with one job's trouble put off for a later sweep."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import services
from jobs.actors import SYSTEM
from jobs.backends import BackendUnavailable
from jobs.backends.kubernetes import KubernetesBackend, manifests
from jobs.models import Job, JobStatus, WaitKind
from jobs.state import jobs_transition_many
from tests.jobs import test_hardening_dispatch, test_kubernetes_lifecycle
from tests.jobs.test_kubernetes_lifecycle import gpu_spec, ns

# Fixtures shared with those tests: the simulated cluster, and tasks recorded, not sent.
cluster = test_kubernetes_lifecycle.cluster
dropped = test_hardening_dispatch.dropped


def dispatching(world, count: int, prefix: str = "b") -> list[Job]:
    """`count` one-GPU jobs launched and admitted, not yet dispatched."""
    jobs = [
        services.job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=gpu_spec(name=f"{prefix}{n}", gpus_per_node=1, cpus=2),
        )
        for n in range(count)
    ]
    assert {job.status for job in jobs} == {JobStatus.DISPATCHING}
    return jobs


def kube_job_names(cluster, job: Job) -> list[str]:
    return sorted(item["metadata"]["name"] for item in cluster.list("jobs", ns(job)))


def test_a_batch_starts_each_job_once(world, cluster):
    jobs = dispatching(world, 5)

    started = services.jobs_dispatch(job_ids=[job.pk for job in jobs])
    again = services.jobs_dispatch(job_ids=[job.pk for job in jobs])  # a redelivered batch

    assert sorted(job.pk for job in started) == sorted(job.pk for job in jobs)
    assert again == []
    assert kube_job_names(cluster, jobs[0]) == sorted(f"gg-{job.pk}-a1" for job in jobs)
    for job in jobs:
        job.refresh_from_db()
        assert job.status == JobStatus.PROVISIONING
        events = [(e.from_status, e.to_status, e.reason) for e in job.events.all()]
        assert events[-1] == (
            JobStatus.DISPATCHING,
            JobStatus.PROVISIONING,
            "submitted to the cluster",
        )
        assert [e for e in events if e[1] == JobStatus.PROVISIONING] == [events[-1]]


def test_a_batch_costs_the_same_statements_for_two_jobs_or_five(world, cluster):
    def statements(count: int, prefix: str) -> int:
        jobs = dispatching(world, count, prefix)
        with CaptureQueriesContext(connection) as captured:
            assert len(services.jobs_dispatch(job_ids=[job.pk for job in jobs])) == count
        return len(captured.captured_queries)

    statements(1, "warm")  # the namespace is set up once
    assert statements(2, "two") == statements(5, "five")  # 8 GPUs in all


def cancel_while_submitted(monkeypatch, victim: Job, then=lambda: None) -> None:
    """The batch's creates go through, then `victim` is cancelled (and `then` runs)
    before the batch records what it started."""
    submit_many = KubernetesBackend.submit_many

    def submit_then_cancel(self, batch):
        outcomes = submit_many(self, batch)
        services.job_cancel(job=Job.objects.get(pk=victim.pk), actor=SYSTEM)
        then()
        return outcomes

    monkeypatch.setattr(KubernetesBackend, "submit_many", submit_then_cancel)


def test_a_job_cancelled_while_its_objects_are_made_is_undone(world, cluster, monkeypatch):
    jobs = dispatching(world, 3)
    victim = jobs[1]
    cancel_while_submitted(monkeypatch, victim)

    started = services.jobs_dispatch(job_ids=[job.pk for job in jobs])

    assert sorted(job.pk for job in started) == [jobs[0].pk, jobs[2].pk]
    victim.refresh_from_db()
    assert victim.status == JobStatus.CANCELLED
    assert kube_job_names(cluster, victim) == sorted(f"gg-{j.pk}-a1" for j in (jobs[0], jobs[2]))


def test_an_undo_the_cluster_refuses_is_retried_by_a_cancel_task(
    world, cluster, dropped, monkeypatch, django_capture_on_commit_callbacks
):
    """The cluster errs while the batch stops a job cancelled meanwhile: the batch still
    starts the others, and the stop goes on in the (retried) cancel task."""
    jobs = dispatching(world, 3)
    victim = jobs[1]
    cancel_while_submitted(
        monkeypatch,
        victim,
        then=lambda: cluster.fail_next("*", rf"/namespaces/{ns(victim)}$", times=None),
    )

    with django_capture_on_commit_callbacks(execute=True):
        started = services.jobs_dispatch(job_ids=[job.pk for job in jobs])

    assert sorted(job.pk for job in started) == [jobs[0].pk, jobs[2].pk]
    assert f"gg-{victim.pk}-a1" in kube_job_names(cluster, victim)  # not stopped yet
    cluster.clear_faults()
    # The cancel's own task and the undo's: either would stop it; both are harmless.
    ran = {task for task in dropped.run() if task[0].startswith("jobs.")}  # (and a mail)
    assert ran == {("jobs.tasks.job_cancel_task", (victim.pk,), None)}
    assert kube_job_names(cluster, victim) == sorted(f"gg-{j.pk}-a1" for j in (jobs[0], jobs[2]))


def test_a_rejected_job_fails_alone(world, cluster):
    jobs = dispatching(world, 3)
    refused = jobs[0]
    cluster.create(
        "namespaces", {"metadata": {"name": ns(refused), "labels": manifests.managed_labels()}}
    )
    # Someone else's Job already holds the name of this job's attempt.
    cluster.create(
        "jobs",
        {
            "metadata": {"name": f"gg-{refused.pk}-a1"},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox:1"}],
                    }
                }
            },
        },
        namespace=ns(refused),
    )

    started = services.jobs_dispatch(job_ids=[job.pk for job in jobs])

    assert sorted(job.pk for job in started) == [jobs[1].pk, jobs[2].pk]
    refused.refresh_from_db()
    assert refused.status == JobStatus.FAILED
    assert "not made by this console" in refused.status_reason


@pytest.mark.parametrize(
    ("error", "counted"),
    [(BackendUnavailable("the API server timed out"), 0), (RuntimeError("boom"), 1)],
)
def test_a_job_that_errs_is_put_off_for_a_later_sweep(
    world,
    cluster,
    monkeypatch,
    dropped,
    django_capture_on_commit_callbacks,
    error,
    counted,
):
    jobs = dispatching(world, 3)
    unlucky = jobs[2]
    run_creates = KubernetesBackend._run_creates

    def flaky(self, creates):
        if any(what.endswith(f"gg-{unlucky.pk}-a1") for what, _, _ in creates):
            raise error
        run_creates(self, creates)

    monkeypatch.setattr(KubernetesBackend, "_run_creates", flaky)

    with django_capture_on_commit_callbacks(execute=True):
        started = services.jobs_dispatch(job_ids=[job.pk for job in jobs])

    assert sorted(job.pk for job in started) == [jobs[0].pk, jobs[1].pk]
    unlucky.refresh_from_db()
    assert unlucky.status == JobStatus.DISPATCHING
    assert unlucky.wait_kind == WaitKind.RETRY
    assert unlucky.dispatch_failures == counted
    assert unlucky.dispatch_after > timezone.now()
    (sweep,) = dropped.sent  # one sweep, for when it is due
    assert sweep[:2] == ("jobs.tasks.jobs_dispatch_task", ()) and 1 < sweep[2] <= 3
    assert services.jobs_dispatch_pending() == 0  # not due yet
    # The later sweep starts it once the API server answers again.
    monkeypatch.setattr(KubernetesBackend, "_run_creates", run_creates)
    Job.objects.filter(pk=unlucky.pk).update(dispatch_after=timezone.now())
    assert services.jobs_dispatch_pending() == 1
    unlucky.refresh_from_db()
    assert unlucky.status == JobStatus.PROVISIONING
    assert f"gg-{unlucky.pk}-a1" in kube_job_names(cluster, unlucky)


def test_an_admission_pass_queues_one_sweep_for_the_jobs_it_admits(
    world,
    cluster,
    dropped,
    django_capture_on_commit_callbacks,
):
    blocker = services.job_submit(
        tenant=world.tenant, user=world.member, spec=gpu_spec(name="all-eight")
    )
    waiting = [
        services.job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=gpu_spec(name=f"w{n}", gpus_per_node=1, cpus=2),
        )
        for n in range(3)
    ]
    assert blocker.status == JobStatus.DISPATCHING
    assert {job.status for job in waiting} == {JobStatus.QUEUED}
    Job.objects.filter(pk=blocker.pk).update(status=JobStatus.SUCCEEDED)  # its GPUs are free again

    with django_capture_on_commit_callbacks(execute=True):
        admitted = services.jobs_admit()

    assert sorted(job.pk for job in admitted) == sorted(job.pk for job in waiting)
    assert dropped.sent == [("jobs.tasks.jobs_dispatch_task", (), None)]
    dropped.run("jobs.tasks.jobs_dispatch_task")
    assert {job.status for job in Job.objects.filter(pk__in=[j.pk for j in waiting])} == {
        JobStatus.PROVISIONING
    }


def test_many_transitions_skip_jobs_that_moved_meanwhile(world, cluster):
    jobs = dispatching(world, 4)
    services.job_cancel(job=jobs[0], actor=SYSTEM)
    stale = Job.objects.get(pk=jobs[0].pk)
    stale.status = JobStatus.DISPATCHING  # what the batch read before the cancel

    with CaptureQueriesContext(connection) as captured:
        moved = jobs_transition_many(
            jobs=[stale, *jobs[1:]],
            to=JobStatus.PROVISIONING,
            actor=SYSTEM,
            reason="submitted to the cluster",
            expected_from=frozenset({JobStatus.DISPATCHING}),
        )

    assert [job.pk for job in moved] == [job.pk for job in jobs[1:]]
    assert all(job.status == JobStatus.PROVISIONING for job in jobs[1:])  # callers' instances too
    assert Job.objects.get(pk=jobs[0].pk).status == JobStatus.CANCELLED
    writes = [q["sql"].split()[0] for q in captured.captured_queries]
    assert writes.count("UPDATE") == 1 and writes.count("INSERT") == 1
