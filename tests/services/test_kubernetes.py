"""Services on a Kubernetes cluster (the sandbox's API server, through the official
client): the Deployment, Service, NetworkPolicy and HPA the console makes, its pods
mirrored as replicas and answering over real HTTP at their pod IPs through the console's
gateway (uvicorn, as deployed), a drained scale-down that removes the drained pod, a
rolling update and a rollback, the cluster's refusal, and a delete that leaves nothing."""

from __future__ import annotations

import base64
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client

from jobs.backends.kubernetes import KubernetesBackend
from jobs.services import tenant_secret_set
from marketplace.models import Region
from marketplace.services import capacity_sync
from services import services, tasks
from services.kubernetes import manifests
from services.models import ReplicaState, ScaleWindow, ServiceStatus
from services.services import ServiceSpec
from storage.services import volume_delete
from tests.conftest import token_client
from tests.factories import VolumeFactory
from tests.services.conftest import H100_PRODUCT, REGION, reconcile_until

pytestmark = pytest.mark.integration


def spec(**overrides) -> ServiceSpec:
    values = {
        "name": "chat",
        "image": "python-3.11",  # a CPU image of the catalog
        "command": ["python", "-m", "server"],
        "port": 8000,
        "region": "us-west",
        "min_replicas": 2,
        "max_replicas": 4,
        "readiness_path": "/healthz",
        "env": {"SANDBOX_READY_AFTER_SECONDS": "0", "SANDBOX_LATENCY_MS": "1"},
        "scale_down_delay": 0,
    }
    values.update(overrides)
    return ServiceSpec(**values)


def deployment(apps, service):
    return apps.read_namespaced_deployment(
        manifests.object_name(service.pk), f"gg-t-{service.tenant_id}"
    )


def live_pods(core, service) -> list:
    pods = core.list_namespaced_pod(
        f"gg-t-{service.tenant_id}", label_selector=f"gpugeek.io/service={service.pk}"
    ).items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def ready(service) -> int:
    return service.replicas.filter(state=ReplicaState.READY).count()


def test_a_service_runs_as_a_deployment_and_answers_through_the_gateway(
    world, apis, cluster_gateway
):
    apps, core = apis
    service = services.service_create(tenant=world.tenant, user=world.owner, spec=spec())
    assert service.pool.backend == "kubernetes"
    _, raw = services.service_token_create(service=service, user=world.owner, name="ci")
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)

    made = deployment(apps, service)
    assert made.spec.replicas == 2
    assert made.spec.template.spec.containers[0].image == "docker.io/library/python:3.11-slim"
    namespace = f"gg-t-{world.tenant.pk}"
    assert (
        core.read_namespaced_service(f"gg-svc-{service.pk}", namespace).spec.ports[0].port == 8000
    )
    networking = client.NetworkingV1Api(apis[0].api_client)
    policy = networking.read_namespaced_network_policy(f"gg-svc-{service.pk}", namespace)
    assert policy.spec.ingress[0].ports[0].port == 8000
    # Every pod is a replica row, reached at its pod IP and the port.
    pods = {p.metadata.name: p.status.pod_ip for p in live_pods(core, service)}
    rows = {r.handle: (r.host, r.host_port, r.state) for r in service.replicas.all()}
    assert rows == {name: (ip, 8000, ReplicaState.READY) for name, ip in pods.items()}

    auth = {"Authorization": f"Bearer {raw}"}
    assert cluster_gateway.get("/svc/acme/chat/v1/models").status_code == 401
    seen = set()
    for _ in range(4):
        answer = cluster_gateway.get("/svc/acme/chat/v1/models?x=1", headers=auth)
        assert answer.status_code == 200, answer.text
        seen.add(answer.json()["pod"])
    assert seen == set(pods)  # round-robin over both pods
    # Streamed through as the pod streams it.
    with cluster_gateway.stream(
        "POST", "/svc/acme/chat/generate", headers=auth, content=b"{}"
    ) as out:
        lines = [line for line in out.iter_lines() if line]
    assert out.status_code == 200 and len(lines) >= 2
    # Each replica's log is its pod's (what the server printed as it started).
    api = token_client(world.owner, world.tenant)
    for row in service.replicas.all():
        answer = api.get(f"/api/v1/services/{service.pk}/replicas/{row.pk}/logs")
        assert answer.status_code == 200, answer.content
        assert answer.json()["lines"] == [f"serving on {row.host}:8000"]


def test_a_request_at_zero_waits_for_the_first_pod_and_is_answered(world, apis, cluster_gateway):
    apps, _ = apis
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=spec(min_replicas=0, auth="public", autoscale_metric="rps", autoscale_target=5),
    )
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.SCALED_TO_ZERO)
    assert deployment(apps, service).spec.replicas == 0
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(cluster_gateway.get, "/svc/acme/chat/hello")
        # The worker's part (the gateway queued a pass): passes until the request is served.
        service = reconcile_until(service, lambda s: answer.done())
        assert answer.result().status_code == 200, answer.result().text
    assert deployment(apps, service).spec.replicas == 1
    event = service.scale_events.get(window=ScaleWindow.COLD_START)
    assert (event.from_replicas, event.to_replicas) == (0, 1)
    assert event.cold_start_seconds is not None and event.cold_start_seconds < 10


def test_a_scale_down_drains_and_removes_the_drained_pod(world, apis):
    apps, core = apis
    service = services.service_create(tenant=world.tenant, user=world.owner, spec=spec())
    service = reconcile_until(service, lambda s: ready(s) == 2)
    services.service_scale(service=service, user=world.owner, min_replicas=1, max_replicas=1)
    service = reconcile_until(
        service, lambda s: s.replicas.filter(state=ReplicaState.DRAINING).exists()
    )
    drained = service.replicas.get(state=ReplicaState.DRAINING)
    kept = service.replicas.get(state=ReplicaState.READY)
    # Still counted while it drains: the Deployment keeps both pods for now.
    assert deployment(apps, service).spec.replicas == 2
    cost = core.read_namespaced_pod(drained.handle, f"gg-t-{world.tenant.pk}").metadata
    assert cost.annotations[manifests.DELETION_COST] == "-1000"
    service = reconcile_until(service, lambda s: deployment(apps, s).spec.replicas == 1)
    service = reconcile_until(
        service, lambda s: [p.metadata.name for p in live_pods(core, s)] == [kept.handle]
    )
    service = reconcile_until(service, lambda s: not s.replicas.filter(pk=drained.pk).exists())
    assert service.status == ServiceStatus.READY
    assert list(service.replicas.values_list("handle", flat=True)) == [kept.handle]


def test_a_new_revision_rolls_out_and_a_rollback_rolls_back(world, apis):
    apps, core = apis
    service = services.service_create(tenant=world.tenant, user=world.owner, spec=spec())
    service = reconcile_until(service, lambda s: ready(s) == 2)
    env = {**service.env, "MODEL": "v2"}
    service = services.service_update(service=service, user=world.owner, changes={"env": env})

    def rolled_to(number):
        def done(s):
            pods = live_pods(core, s)
            labels = {p.metadata.labels[manifests.REVISION_LABEL] for p in pods}
            # The rows are mirrored by a pass: a pod can go between the pass and this read.
            serving = s.replicas.exclude(state=ReplicaState.STOPPED)
            rows = set(serving.values_list("revision__number", flat=True))
            return len(pods) == 2 and labels == {str(number)} and rows == {number} and ready(s) == 2

        return done

    service = reconcile_until(service, rolled_to(2), timeout=60)
    template = deployment(apps, service).spec.template.spec.containers[0]
    assert {e.name: e.value for e in template.env}["MODEL"] == "v2"
    serving = service.replicas.exclude(state=ReplicaState.STOPPED)  # (the old: billed, stopped)
    assert set(serving.values_list("revision__number", flat=True)) == {2}
    first = service.revisions.get(number=1)
    service = services.service_rollback(
        service=service, user=world.owner, revision_number=first.number
    )
    service = reconcile_until(service, rolled_to(3), timeout=60)
    template = deployment(apps, service).spec.template.spec.containers[0]
    assert "MODEL" not in {e.name for e in template.env}  # the lists are replaced, not merged


def test_the_pods_mount_the_volumes_claims_read_only(world, apis):
    _, core = apis
    weights = VolumeFactory(
        tenant=world.tenant, name="weights", region=Region.objects.get(slug="us-west")
    )
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=spec(min_replicas=1, volumes=[{"name": "weights", "path": "/models"}]),
    )
    service = reconcile_until(service, lambda s: ready(s) == 1)
    namespace = f"gg-t-{world.tenant.pk}"
    claim = core.read_namespaced_persistent_volume_claim(f"gg-vol-{weights.pk}", namespace)
    assert claim.spec.access_modes == ["ReadWriteOnce"]  # (a single-writer volume's claim)
    (pod,) = live_pods(core, service)
    (volume,) = pod.spec.volumes
    assert volume.persistent_volume_claim.claim_name == f"gg-vol-{weights.pk}"
    assert volume.persistent_volume_claim.read_only is True
    (mount,) = pod.spec.containers[0].volume_mounts
    assert (mount.mount_path, mount.read_only) == ("/models", True)
    # While the replicas mount it, the volume stays.
    with pytest.raises(services.ServiceError, match="mounted by the replicas"):
        volume_delete(volume=weights, user=world.owner)


def test_cpu_scaling_is_the_clusters_autoscaler(world, apis, cluster, cluster_gateway):
    apps, _ = apis
    cluster.hpa_sync_seconds, cluster.metrics_window_seconds = 0.2, 1.0
    autoscaling = client.AutoscalingV2Api(apps.api_client)
    busy = {**spec().env, "SANDBOX_CPU_MS_PER_REQUEST": "1000"}  # a second of CPU each
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=spec(
            env=busy,
            auth="public",
            autoscale_metric="cpu",
            autoscale_target=50,
            min_replicas=1,
            max_replicas=3,
        ),
    )
    service = reconcile_until(service, lambda s: ready(s) == 1)
    namespace = f"gg-t-{world.tenant.pk}"
    hpa = autoscaling.read_namespaced_horizontal_pod_autoscaler(f"gg-svc-{service.pk}", namespace)
    assert (hpa.spec.min_replicas, hpa.spec.max_replicas) == (1, 3)
    assert hpa.spec.metrics[0].resource.target.average_utilization == 50
    # Load through the gateway (bounded): the HPA scales the Deployment up, the console
    # follows its count and records it as a scale event.
    deadline = time.monotonic() + 20
    while deployment(apps, service).spec.replicas < 2 and time.monotonic() < deadline:
        for _ in range(5):
            assert cluster_gateway.get("/svc/acme/chat/work").status_code == 200
        time.sleep(0.1)
    service = reconcile_until(service, lambda s: ready(s) >= 2)
    assert service.desired_replicas >= 2
    assert service.scale_events.filter(window=ScaleWindow.HPA, from_replicas=1).exists()
    # Passes that change nothing leave the HPA alone.
    hpa = autoscaling.read_namespaced_horizontal_pod_autoscaler(f"gg-svc-{service.pk}", namespace)
    assert hpa.spec.max_replicas == 3
    # Back to the console's own decisions: the HPA goes.
    services.service_update(
        service=service,
        user=world.owner,
        changes={"autoscale_metric": "concurrency", "autoscale_target": 5},
    )
    reconcile_until(service, lambda s: True)
    with pytest.raises(client.ApiException) as gone:
        autoscaling.read_namespaced_horizontal_pod_autoscaler(f"gg-svc-{service.pk}", namespace)
    assert gone.value.status == 404


def test_gpu_replicas_get_their_gpus_and_scale_on_gpu_utilisation(
    world, apis, cluster, cluster_gateway
):
    apps, core = apis
    cluster.add_node("h100-1", labels={**REGION, "nvidia.com/gpu.product": H100_PRODUCT})
    capacity_sync(backend=KubernetesBackend(cluster.api_client()))
    cluster.hpa_sync_seconds, cluster.metrics_window_seconds = 0.2, 1.0
    busy = {**spec().env, "SANDBOX_GPU_MS_PER_REQUEST": "1000"}  # a GPU-second each
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=spec(
            image="pytorch-2-5-cuda12-4",
            env=busy,
            auth="public",
            gpu_type="h100-80gb",
            gpus_per_replica=2,
            autoscale_metric="gpu",
            autoscale_target=50,
            min_replicas=1,
            max_replicas=3,
        ),
    )
    assert service.pool.gpu_type.slug == "h100-80gb"
    service = reconcile_until(service, lambda s: ready(s) == 1)
    (pod,) = live_pods(core, service)
    assert pod.spec.node_name == "h100-1"
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    autoscaling = client.AutoscalingV2Api(apps.api_client)
    name, namespace = f"gg-svc-{service.pk}", f"gg-t-{world.tenant.pk}"
    hpa = autoscaling.read_namespaced_horizontal_pod_autoscaler(name, namespace)
    assert hpa.spec.metrics[0].pods.metric.name == "gpu_utilization"
    # Load through the gateway (bounded): busy GPUs make the HPA add a replica.
    deadline = time.monotonic() + 20
    while deployment(apps, service).spec.replicas < 2 and time.monotonic() < deadline:
        for _ in range(5):
            assert cluster_gateway.get("/svc/acme/chat/work").status_code == 200
        time.sleep(0.1)
    service = reconcile_until(service, lambda s: ready(s) >= 2)
    assert service.scale_events.filter(window=ScaleWindow.HPA, metric="gpu").exists()


def test_a_refused_service_fails_with_the_reason_and_leaves_nothing(world, apis, cluster):
    apps, core = apis
    cluster.fail_next(
        "POST", "/deployments$", status=422, times=None, message="spec.template: refused here"
    )
    service = services.service_create(tenant=world.tenant, user=world.owner, spec=spec())
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.FAILED)
    assert "refused here" in service.status_reason
    with pytest.raises(client.ApiException):
        deployment(apps, service)
    # What was made before the refusal (its Service, its NetworkPolicy) is gone.
    namespace = f"gg-t-{world.tenant.pk}"
    assert not core.list_namespaced_service(namespace).items
    networking = client.NetworkingV1Api(apps.api_client)
    names = [p.metadata.name for p in networking.list_namespaced_network_policy(namespace).items]
    assert names == ["gpugeek-default"]


def test_the_sandbox_refuses_a_port_out_of_range(apis):
    apps, _ = apis
    body = {
        "metadata": {"name": "bad"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {
                    "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 70000}]}]
                },
            },
        },
    }
    client.CoreV1Api(apps.api_client).create_namespace({"metadata": {"name": "ports"}})
    with pytest.raises(client.ApiException) as refused:
        apps.create_namespaced_deployment("ports", body)
    assert refused.value.status == 422 and "between 1 and 65535" in refused.value.body


def test_a_deleted_service_leaves_no_object(
    world, apis, django_capture_on_commit_callbacks, monkeypatch
):
    apps, core = apis
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="HF_TOKEN", value="hf_x")
    service = services.service_create(
        tenant=world.tenant, user=world.owner, spec=spec(secrets=["HF_TOKEN"], min_replicas=1)
    )
    service = reconcile_until(service, lambda s: ready(s) == 1)
    namespace, name = f"gg-t-{world.tenant.pk}", f"gg-svc-{service.pk}"
    # The secret's value is in the revision's Secret, the pod names it.
    stored = core.read_namespaced_secret(f"{name}-r1", namespace)
    assert base64.b64decode(stored.data["HF_TOKEN"]) == b"hf_x"
    env = deployment(apps, service).spec.template.spec.containers[0].env
    assert [e.value_from.secret_key_ref.name for e in env if e.name == "HF_TOKEN"] == [f"{name}-r1"]
    # The worker's part, run here when it is queued.
    task = tasks.service_objects_delete_task
    monkeypatch.setattr(task, "apply_async", lambda args, countdown=None: task(*args))
    with django_capture_on_commit_callbacks(execute=True):
        services.service_delete(service=service, user=world.owner)
    with pytest.raises(client.ApiException):
        apps.read_namespaced_deployment(name, namespace)
    assert [s.metadata.name for s in core.list_namespaced_service(namespace).items] == []
    assert not core.list_namespaced_secret(namespace, label_selector="gpugeek.io/service").items
    deadline = time.monotonic() + 10
    while core.list_namespaced_pod(namespace).items and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not core.list_namespaced_pod(namespace).items


def test_the_cluster_only_takes_images_of_the_catalog(world, cluster):
    with pytest.raises(services.ServiceError) as refused:
        services.service_create(
            tenant=world.tenant, user=world.owner, spec=spec(image="evil.example/miner:1")
        )
    assert refused.value.field == "image"
    with pytest.raises(services.ServiceError) as refused:
        services.service_create(
            tenant=world.tenant,
            user=world.owner,
            spec=spec(autoscale_metric="cpu", autoscale_target=60, min_replicas=0),
        )
    assert refused.value.field == "min_replicas"
