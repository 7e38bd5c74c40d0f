"""Priorities and preemption on the sandbox cluster (the simulated API server, through
the real services and the Kubernetes backend): the console creates its PriorityClasses,
pods carry them, and a critical job that doesn't fit preempts a low one, whose old
attempt is stopped with notice and which resumes from its checkpoint as a new attempt
once there is room again."""

from __future__ import annotations

import pytest

from jobs.models import JobStatus
from jobs.services import job_submit
from marketplace.models import TenantQuota
from sandbox.kubesim import ApiError
from tests.jobs.test_kubernetes_lifecycle import (
    cluster,  # noqa: F401  (a fixture)
    gpu_spec,
    live_pods,
    ns,
    settle,
)
from tests.jobs_helpers import launch


def test_a_critical_job_preempts_a_low_one_which_resumes_from_its_checkpoint(
    world,
    cluster,  # noqa: F811  (the lifecycle tests' fixture: three nodes, pools synced)
    tasks_in_process,
    django_capture_on_commit_callbacks,
):
    TenantQuota.objects.filter(tenant=world.tenant).delete()
    low = settle(cluster, launch(world, gpu_spec(name="low", priority="low")), JobStatus.RUNNING)
    # The console made its classes; the pod names one and the API server resolved it.
    assert cluster.get("priorityclasses", None, "gpugeek-critical")["value"] == 100000
    (pod,) = live_pods(cluster, low)
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == ("gpugeek-low", 1000)

    with django_capture_on_commit_callbacks(execute=True):
        critical = job_submit(
            tenant=world.tenant,
            user=world.admin,
            spec=gpu_spec(name="critical", priority="critical"),
        )
    low.refresh_from_db()
    assert (low.status, low.attempt) == (JobStatus.QUEUED, 2)
    preempted = low.events.get(to_status=JobStatus.PREEMPTED)
    assert f"job #{critical.pk} critical" in preempted.reason
    # Its old attempt was stopped with notice (suspended: pods deleted after the grace).
    assert cluster.get("jobs", ns(low), f"gg-{low.pk}-a1")["spec"]["suspend"] is True
    cluster.tick()
    assert live_pods(cluster, low) == []

    critical = settle(cluster, critical, JobStatus.RUNNING)
    (critical_pod,) = live_pods(cluster, critical)
    assert critical_pod["spec"]["priority"] == 100000

    cluster.succeed_pod(ns(critical), critical_pod["metadata"]["name"])
    with django_capture_on_commit_callbacks(execute=True):
        settle(cluster, critical, JobStatus.SUCCEEDED)
    low = settle(cluster, low, JobStatus.RUNNING)
    assert low.attempt == 2
    resumed = cluster.get("jobs", ns(low), f"gg-{low.pk}-a2")
    assert resumed["spec"]["template"]["metadata"]["annotations"]["gpugeek.io/resumed"] == "1"
    assert cluster.get("jobs", ns(low), f"gg-{low.pk}-a1") is None  # the old attempt's Job


def test_a_pod_naming_a_missing_priority_class_is_refused(cluster):  # noqa: F811
    """The API server's Priority admission, as the simulated server does it."""
    cluster.create(
        "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"priorityClassName": "nope", "containers": [{"name": "c", "image": "i:1"}]},
    }
    with pytest.raises(ApiError) as refused:
        cluster.create("pods", pod, "x")
    assert refused.value.code == 403
    assert "no PriorityClass with name nope was found" in str(refused.value)
