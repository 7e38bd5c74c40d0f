"""Issue 17: the console's ClusterRole (deploy/kubernetes/rbac.yaml) grants exactly what
the Kubernetes backend calls. A representative lifecycle runs against the simulated API
server (namespace set-up, a registry pull secret, a two-tier spot job with secret env,
observation, logs, published files, the watch, pause/resume, cancel, release, capacity
sync, the pull secret's removal; a service's objects, scaling, revision and delete; then
the jobs through Kueue and JobSet); each recorded request is mapped
to the (API group, resource, verb) that RBAC checks, and the set must equal the rules."""

from __future__ import annotations

import queue
import threading
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml
from django.test import TestCase

from jobs import services, tasks
from jobs.actors import SYSTEM
from jobs.backends import get_backend
from jobs.backends.kubernetes import client as kubernetes_client
from jobs.backends.kubernetes.watch import watch_jobs
from jobs.models import JobStatus
from jobs.services import tenant_secret_set
from marketplace.models import AllowedRegistry, RegistryCredential
from marketplace.services import (
    capacity_sync,
    image_create,
    registry_credential_delete,
    registry_credential_set,
)
from services import services as service_services
from services import tasks as service_tasks
from services.models import ReplicaState, ServiceStatus
from services.services import ServiceSpec
from storage.services import volume_delete, volume_resize
from tests.factories import VolumeFactory
from tests.jobs.test_kubernetes_lifecycle import (
    cluster,  # noqa: F401  (a fixture)
    gpu_spec,
    settle,
)
from tests.jobs_helpers import launch
from tests.services.conftest import reconcile_until

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "rbac.yaml"

# Rules the lifecycle below doesn't reach, each with the code that needs it.
NOT_EXERCISED = {
    # client._check_owned reads a LocalQueue whose create answered 409 (a tenant namespace
    # set up again by another process): the namespace set-up is cached per process here.
    ("kueue.x-k8s.io", "localqueues", "get"),
    # client._check_owned reads the ConfigMap of a job's published files whose create
    # answered 409 (another publish made it between this one's patch and create).
    ("", "configmaps", "get"),
}

VERB_OF_METHOD = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def rbac_triple(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str] | None:
    """(group, resource[/subresource], verb) that the API server's authorizer checks for a
    request, as in k8s.io/apiserver's RequestInfoFactory; None for discovery paths."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    if parts[0] == "api":
        group, rest = "", parts[2:]  # /api/v1/...
    elif parts[0] == "apis" and len(parts) > 3:
        group, rest = parts[1], parts[3:]  # /apis/<group>/<version>/...
    else:
        return None  # /api, /apis, /apis/<group>/<version>: discovery, allowed to everyone
    if not rest:
        return None
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2:]
    if sub:
        resource = f"{resource}/{sub[0]}"
    if method == "GET":
        watching = query.get("watch") in ("true", "1", "True")
        verb = "watch" if watching else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = VERB_OF_METHOD[method]
    return group, resource, verb


def granted(document: dict) -> set[tuple[str, str, str]]:
    triples = set()
    for rule in document["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    triples.add((group, resource, verb))
    return triples


def cluster_role() -> dict:
    documents = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    (role,) = [d for d in documents if d["kind"] == "ClusterRole"]
    return role


def used(kube) -> set[tuple[str, str, str]]:
    return {
        triple
        for r in kube.requests
        if (triple := rbac_triple(r.method, r.path, r.query)) is not None
    }


def run_plain_lifecycle(world, kube) -> None:
    AllowedRegistry.objects.create(host="registry.example.com:5000")
    image_create(
        tenant=world.tenant,
        slug="private-trainer",
        reference="registry.example.com:5000/acme/trainer:1.0",
        user=world.admin,
        name="Trainer",
        kind="framework",
        compatible_with=["nvidia", "cpu"],
    )
    registry_credential_set(
        tenant=world.tenant,
        user=world.admin,
        registry="registry.example.com:5000",
        username="robot",
        password="first-token",
    )
    spec = gpu_spec(
        image="private-trainer",
        nodes=2,
        spot_ratio=Decimal("0.5"),
        secret_env={"HF_TOKEN": "hf_secret"},
    )
    job = settle(kube, launch(world, spec), JobStatus.RUNNING)
    backend = get_backend("kubernetes")
    backend.logs(job)
    backend.gpu_readings([job])
    assert backend.publish_file(job, "notes", "first")  # made with the first file
    assert backend.publish_file(job, "notes", "second")  # patched

    job = services.job_pause(job=job, actor=SYSTEM)
    tasks.job_suspend_task(job.pk)
    job = settle(kube, job, JobStatus.PAUSED)
    job = services.job_resume(job=job, actor=SYSTEM)
    tasks.job_resume_task(job.pk)
    job = settle(kube, job, JobStatus.RUNNING)
    services.job_cancel(job=job, actor=SYSTEM)
    tasks.job_cancel_task(job.pk)
    settle(kube, job, JobStatus.CANCELLED)  # its pods gone: its GPUs are free again
    tasks.job_release_task(job.pk)

    # A new login replaces the Secret (409 on create, then read and replace).
    registry_credential_set(
        tenant=world.tenant,
        user=world.admin,
        registry="registry.example.com:5000",
        username="robot",
        password="second-token",
    )
    cpu = {"gpu_type": None, "gpus_per_node": 0, "cpus": 1}
    second = launch(world, gpu_spec(name="again", image="private-trainer", **cpu))
    services.job_cancel(job=second, actor=SYSTEM)
    tasks.job_cancel_task(second.pk)
    credential = RegistryCredential.objects.get(tenant=world.tenant)
    registry_credential_delete(credential=credential, user=world.admin)
    tasks.registry_pull_secret_remove_task(world.tenant.pk, credential.registry)

    # A dispatch that runs again finds its objects (409: its volume's claim too) and reads
    # them to check they are its own; a job whose pods can't be created is explained from
    # its Job's events.
    volume = VolumeFactory(tenant=world.tenant, name="data", region__slug="us-west")
    kube.create(
        "resourcequotas",
        {"metadata": {"name": "blocker"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}},
        namespace=f"gg-t-{world.tenant.pk}",
    )
    blocked = redispatched(
        world, backend, gpu_spec(name="blocked", volumes=[{"name": "data", "path": "/data"}])
    )
    kube.tick()
    assert backend.observe(blocked).phase == "pending"
    kube.delete("resourcequotas", f"gg-t-{world.tenant.pk}", "blocker")
    services.job_cancel(job=blocked, actor=SYSTEM)
    tasks.job_cancel_task(blocked.pk)
    settle(kube, blocked, JobStatus.CANCELLED)
    with TestCase.captureOnCommitCallbacks(execute=True):  # its claim grows, then goes
        volume_resize(volume=volume, user=world.admin, size_gib=20)
        volume_delete(volume=volume, user=world.admin)

    capacity_sync(backend=backend)
    # Self-repair cordons a node whose GPUs report an XID error; staff uncordon it.
    assert backend.node_cordon("cpu-1")
    assert backend.node_cordon("cpu-1", cordoned=False)
    run_the_watch(kube)


def run_service_lifecycle(world) -> None:
    """A service on the cluster: its objects with a secret, ready pods, an HPA that comes
    and goes, a drained scale-down, a new revision and the delete."""
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="HF_TOKEN", value="hf_x")
    spec = ServiceSpec(
        name="chat",
        image="python-3.11",
        command=["python", "-m", "server"],
        port=8000,
        region="us-west",
        min_replicas=2,
        max_replicas=3,
        readiness_path="/healthz",
        env={"SANDBOX_READY_AFTER_SECONDS": "0"},
        secrets=["HF_TOKEN"],
        autoscale_metric="cpu",
        autoscale_target=60,
        scale_down_delay=0,
    )
    service = service_services.service_create(tenant=world.tenant, user=world.owner, spec=spec)
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    service = service_services.service_update(  # the HPA changes, then goes
        service=service, user=world.owner, changes={"autoscale_target": 70}
    )
    reconcile_until(service, lambda s: True)
    service = service_services.service_update(
        service=service,
        user=world.owner,
        changes={"autoscale_metric": "concurrency", "autoscale_target": 5},
    )
    reconcile_until(service, lambda s: True)
    service = service_services.service_scale(
        service=service, user=world.owner, min_replicas=1, max_replicas=1
    )
    reconcile_until(service, lambda s: s.replicas.filter(state=ReplicaState.DRAINING).exists())
    service = service_services.service_update(
        service=service, user=world.owner, changes={"port": 8001}
    )
    reconcile_until(service, lambda s: True)
    tenant_id, service_id = service.tenant_id, service.pk
    with TestCase.captureOnCommitCallbacks(execute=False):
        service_services.service_delete(service=service, user=world.owner)
    service_tasks.service_objects_delete_task(tenant_id, service_id)


def redispatched(world, backend, spec):
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=spec)
    backend.submit(job)  # a first task that died before recording its success
    return services.job_dispatch(job=job)


def run_the_watch(kube) -> None:
    changed: queue.Queue[int] = queue.Queue()
    stop = threading.Event()
    thread = threading.Thread(
        target=watch_jobs,
        kwargs={
            "api_client": kube.api_client(),
            "stop_event": stop,
            "on_change": changed.put,
            "timeout_seconds": 1,
            "max_backoff": 0.2,
        },
        daemon=True,
    )
    thread.start()
    try:
        for _ in range(50):
            if any(r.query.get("watch") in ("true", "1", "True") for r in kube.requests):
                break
            threading.Event().wait(0.1)
    finally:
        stop.set()
        thread.join(timeout=10)


def run_kueue_lifecycle(world, kube, settings) -> None:
    kube.install_kueue()
    kube.install_jobset()
    kube.create(
        "clusterqueues", {"metadata": {"name": "gpu-cluster-queue"}, "spec": {"cohort": "all"}}
    )
    settings.KUEUE = "on"
    settings.KUEUE_QUEUE_NAME = "gpugeek"
    settings.KUEUE_CLUSTER_QUEUE = "gpu-cluster-queue"
    kubernetes_client.API_GROUPS_CACHE.clear()
    try:
        spec = gpu_spec(name="split", nodes=2, spot_ratio=Decimal("0.5"))
        job = settle(kube, launch(world, spec), JobStatus.RUNNING)
        job = services.job_pause(job=job, actor=SYSTEM)
        tasks.job_suspend_task(job.pk)
        job = settle(kube, job, JobStatus.PAUSED)
        job = services.job_resume(job=job, actor=SYSTEM)
        tasks.job_resume_task(job.pk)
        job = settle(kube, job, JobStatus.RUNNING)
        services.job_cancel(job=job, actor=SYSTEM)
        tasks.job_cancel_task(job.pk)
        settle(kube, job, JobStatus.CANCELLED)
        again = redispatched(world, get_backend("kubernetes"), spec)
        services.job_cancel(job=again, actor=SYSTEM)
        tasks.job_cancel_task(again.pk)
    finally:
        kubernetes_client.API_GROUPS_CACHE.clear()


def test_the_request_mapping_follows_the_authorizer():
    assert rbac_triple("GET", "/api/v1/namespaces/gg-t-1/pods/p-0/log", {}) == (
        "",
        "pods/log",
        "get",
    )
    assert rbac_triple("GET", "/apis/batch/v1/jobs", {"watch": "true"}) == (
        "batch",
        "jobs",
        "watch",
    )
    assert rbac_triple("GET", "/api/v1/namespaces/gg-t-1", {}) == ("", "namespaces", "get")
    assert rbac_triple("POST", "/api/v1/namespaces", {}) == ("", "namespaces", "create")
    assert rbac_triple("GET", "/apis/batch/v1", {}) is None
    assert rbac_triple("DELETE", "/apis/batch/v1/namespaces/n/jobs/j", {}) == (
        "batch",
        "jobs",
        "delete",
    )


@pytest.fixture
def kube(cluster):  # noqa: F811  (the lifecycle tests' fixture: three nodes, pools synced)
    return cluster


@pytest.mark.timeout(120)
def test_the_cluster_role_grants_exactly_what_the_backend_calls(world, kube, settings):
    run_plain_lifecycle(world, kube)
    run_service_lifecycle(world)
    run_kueue_lifecycle(world, kube, settings)

    calls = used(kube)
    rules = granted(cluster_role())
    assert calls - rules == set(), "the backend calls what the ClusterRole doesn't grant"
    assert not calls & NOT_EXERCISED, "exercised now: remove it from NOT_EXERCISED"
    assert rules - calls - NOT_EXERCISED == set(), "granted but never called"
