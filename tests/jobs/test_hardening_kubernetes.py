"""Issue 13 §4, Kubernetes: a cached private image is pulled again for every pod, every
container's scratch disk is bounded, and two consoles sharing a cluster never act on each
other's objects (installation label on everything, 409 accepted only for our own objects,
lists and watches select on it)."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time

import pytest

from console import settings as console_settings  # as loaded, before any override
from jobs import services
from jobs.backends import get_backend
from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.watch import watch_jobs
from jobs.models import JobStatus
from marketplace.models import TenantQuota
from tests.factories import ImageFactory
from tests.jobs.test_kubernetes_lifecycle import H100, cluster, gpu_spec, ns, settle
from tests.jobs.test_kubernetes_manifests import cpu_job, h100_job, rendered
from tests.jobs_helpers import launch

__all__ = ["cluster"]  # the fixture, imported for these tests

OURS, THEIRS = "gg-console-a", "gg-console-b"


@pytest.fixture(autouse=True)
def installation(settings):
    settings.GPUGEEK_INSTALLATION_ID = OURS
    settings.KUBERNETES_EPHEMERAL_STORAGE = "20Gi"


# --- manifests ----


def containers(kube_job: dict) -> list[dict]:
    pod = kube_job["spec"]["template"]["spec"]
    return pod["containers"] + pod.get("initContainers", [])


def test_every_container_has_bounded_ephemeral_storage(settings):
    for job in (cpu_job(), h100_job()):
        for kube_job in manifests.job_manifests(job):
            for container in containers(kube_job):
                resources = container["resources"]
                assert resources["requests"]["ephemeral-storage"] == "20Gi"
                assert resources["limits"]["ephemeral-storage"] == "20Gi"
    settings.KUBERNETES_EPHEMERAL_STORAGE = "50Gi"
    [kube_job] = manifests.job_manifests(cpu_job())
    assert containers(kube_job)[0]["resources"]["limits"]["ephemeral-storage"] == "50Gi"


def test_a_private_image_is_always_pulled_and_a_public_one_keeps_the_default(world):
    job = cpu_job()
    job.image = ImageFactory(tenant=None, slug="public-python")
    [public] = manifests.job_manifests(job)
    assert "imagePullPolicy" not in containers(public)[0]

    job.image = ImageFactory(tenant=world.tenant, slug="our-trainer")
    [private] = manifests.job_manifests(job)
    assert containers(private)[0]["imagePullPolicy"] == "Always"


def labelled_objects(value):
    """Every Kubernetes object (a dict with apiVersion and metadata) in `value`."""
    if isinstance(value, dict):
        if "apiVersion" in value and "metadata" in value:
            yield value
        for item in value.values():
            yield from labelled_objects(item)
    elif isinstance(value, list):
        for item in value:
            yield from labelled_objects(item)


def test_every_object_the_console_makes_carries_the_installation_label():
    job = h100_job()
    objects = list(labelled_objects(rendered(job, secrets={"TOKEN": "x"})))
    objects += list(labelled_objects(manifests.jobset_manifest(job, kueue_queue="q")))
    objects.append(manifests.local_queue_manifest(job.tenant_id, "q", "cq"))
    kinds = set()
    for obj in objects:
        kinds.add(obj["kind"])
        assert obj["metadata"]["labels"][manifests.INSTALLATION_LABEL] == OURS, obj["kind"]
    for kube_job in manifests.job_manifests(job):  # and the pods they make
        labels = kube_job["spec"]["template"]["metadata"]["labels"]
        assert labels[manifests.INSTALLATION_LABEL] == OURS
    assert {"Namespace", "ResourceQuota", "LimitRange", "NetworkPolicy", "Service"} <= kinds
    assert {"Secret", "Job", "JobSet", "LocalQueue"} <= kinds


@pytest.mark.skipif(
    bool(os.environ.get("GPUGEEK_INSTALLATION_ID")), reason="the id is set explicitly"
)
def test_the_default_installation_id_is_derived_from_the_secret_key():
    """Without GPUGEEK_INSTALLATION_ID it is a short hash of SECRET_KEY: the same on every
    start of this console, different for a console with another key."""
    digest = hashlib.sha256(b"gpugeek-installation:" + console_settings.SECRET_KEY.encode())
    assert "gg-" + digest.hexdigest()[:12] == console_settings.GPUGEEK_INSTALLATION_ID


# --- two consoles on one cluster ----


def test_a_namespace_of_another_installation_is_refused_with_a_clear_reason(world, cluster):
    namespace = f"gg-t-{world.tenant.pk}"
    cluster.create(
        "namespaces",
        {
            "metadata": {
                "name": namespace,
                "labels": {manifests.MANAGED_BY: manifests.MANAGER, **_theirs()},
            }
        },
    )
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=gpu_spec())

    job = services.job_dispatch(job=job)

    assert job.status == JobStatus.FAILED
    assert "not made by this console" in job.status_reason
    assert THEIRS in job.status_reason
    assert cluster.list("jobs", namespace) == []  # nothing created in their namespace


def test_an_unlabelled_object_of_the_same_name_is_not_adopted(world, cluster):
    namespace = f"gg-t-{world.tenant.pk}"
    cluster.create(
        "namespaces", {"metadata": {"name": namespace, "labels": manifests.managed_labels()}}
    )
    # A job reached on a port gets a Service (a lone pod without ports gets none).
    spec = gpu_spec(ports=[{"name": "jupyter", "port": 8888}])
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=spec)
    # Someone else's Service already holds the job's rendezvous name.
    cluster.create(
        "services",
        {"metadata": {"name": f"gg-{job.pk}"}, "spec": {"clusterIP": "None"}},
        namespace=namespace,
    )

    job = services.job_dispatch(job=job)

    assert job.status == JobStatus.FAILED
    assert f"service gg-{job.pk}" in job.status_reason
    assert "not made by this console" in job.status_reason


def test_our_own_existing_objects_are_still_done_already(world, cluster):
    job = launch(world, gpu_spec())
    backend = get_backend("kubernetes")

    backend.submit(job)  # a redelivered dispatch: every create answers 409, all ours

    assert [j["metadata"]["name"] for j in cluster.list("jobs", ns(job))] == [f"gg-{job.pk}-a1"]


def test_another_console_neither_sees_nor_deletes_our_jobs(world, cluster, settings):
    spec = gpu_spec(ports=[{"name": "jupyter", "port": 8888}])  # so it has a Service too
    job = settle(cluster, launch(world, spec), JobStatus.RUNNING)
    backend = get_backend("kubernetes")

    settings.GPUGEEK_INSTALLATION_ID = THEIRS  # the same job id, seen from the other console
    observed = backend.observe(job)
    backend.cancel(job)
    backend.release(job)
    backend.remove_pull_secret(job.tenant_id, "registry.example.test")
    settings.GPUGEEK_INSTALLATION_ID = OURS

    assert observed.phase != "running"
    assert cluster.get("jobs", ns(job), f"gg-{job.pk}-a1") is not None
    assert cluster.get("services", ns(job), f"gg-{job.pk}") is not None
    assert backend.observe(job).phase == "running"


def test_the_watch_reports_only_this_installations_jobs(kube_api, settings):
    changed: queue.Queue[int] = queue.Queue()
    stop = threading.Event()
    kube_api.add_node("n1", labels=H100)

    def kube_job(job_id: int, labels: dict) -> dict:
        labels = {**labels, manifests.JOB_LABEL: str(job_id)}
        return {
            "metadata": {"name": f"gg-{job_id}-a1", "labels": labels},
            "spec": {
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox:1"}],
                    },
                }
            },
        }

    thread = threading.Thread(
        target=watch_jobs,
        kwargs={
            "api_client": kube_api.api_client(),
            "stop_event": stop,
            "on_change": changed.put,
            "timeout_seconds": 1,
            "max_backoff": 0.2,
        },
        daemon=True,
    )
    thread.start()
    try:
        theirs = {manifests.MANAGED_BY: manifests.MANAGER, **_theirs()}
        kube_api.create("jobs", kube_job(41, theirs), namespace="default")
        kube_api.create("jobs", kube_job(42, manifests.managed_labels()), namespace="default")
        seen: set[int] = set()
        deadline = time.monotonic() + 10
        while 42 not in seen and time.monotonic() < deadline:
            try:
                seen.add(changed.get(timeout=0.2))
            except queue.Empty:
                continue
        time.sleep(0.3)
        while not changed.empty():
            seen.add(changed.get())
    finally:
        stop.set()
        thread.join(timeout=10)
    assert 42 in seen
    assert 41 not in seen


def _theirs() -> dict[str, str]:
    return {manifests.INSTALLATION_LABEL: THEIRS}


def test_quota_patch_is_refused_in_a_foreign_namespace(world, cluster):
    """ensure_namespace stops at the foreign namespace: its quota is never patched."""
    TenantQuota.objects.filter(tenant=world.tenant).delete()
    namespace = f"gg-t-{world.tenant.pk}"
    cluster.create("namespaces", {"metadata": {"name": namespace, "labels": _theirs()}})
    backend = get_backend("kubernetes")
    with pytest.raises(Exception, match="not made by this console"):
        backend.ensure_namespace(world.tenant.pk)
    assert cluster.list("resourcequotas", namespace) == []


# --- the namespace set up once per burst ----


def namespace_setup_posts(cluster) -> list[str]:
    setup = ("/namespaces", "/resourcequotas", "/limitranges", "/networkpolicies")
    return [r.path for r in cluster.requests if r.method == "POST" and r.path.endswith(setup)]


def test_a_burst_of_launches_sets_the_namespace_up_once_and_again_when_it_changes(world, cluster):
    small = {"gpus_per_node": 1, "cpus": 2}
    launch(world, gpu_spec(name="first", **small))
    cluster.requests.clear()
    launch(world, gpu_spec(name="second", **small))  # within the re-check window
    assert namespace_setup_posts(cluster) == []
    # A changed quota changes what the namespace must hold: it is set up again.
    TenantQuota.objects.create(tenant=world.tenant, max_gpus=64)
    cluster.requests.clear()
    launch(world, gpu_spec(name="third", **small))
    assert any(path.endswith("/resourcequotas") for path in namespace_setup_posts(cluster))


def test_a_failed_attempt_forgets_the_namespace_so_the_retry_sets_it_up_again(world, cluster):
    small = {"gpus_per_node": 1, "cpus": 2}
    launch(world, gpu_spec(name="first", **small))
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=gpu_spec(**small))
    cluster.fail_next("POST", r"/jobs$", status=500)  # the Job create fails once
    job = services.job_dispatch(job=job)  # put off for a later sweep
    assert job.status == JobStatus.DISPATCHING and job.dispatch_after is not None
    cluster.requests.clear()

    job = services.job_dispatch(job=job)

    assert job.status == JobStatus.PROVISIONING, job.status_reason
    assert any(path.endswith("/namespaces") for path in namespace_setup_posts(cluster))
