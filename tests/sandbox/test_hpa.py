"""HorizontalPodAutoscalers of the Kubernetes simulator, through the official client: the
load is real HTTP requests sent to the pods at their podIP and port."""

from __future__ import annotations

import urllib.request

import pytest
from kubernetes import client

NS = "hpa-t"
PORT = 8000


@pytest.fixture
def apis(kube_api):
    api = kube_api.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    kube_api.add_node("node-a")
    kube_api.hpa_sync_seconds = 0.2
    kube_api.metrics_window_seconds = 1.0
    return core, client.AppsV1Api(api), client.AutoscalingV2Api(api)


def serving(name: str, *, env: dict[str, str], gpus: int = 0) -> client.V1Deployment:
    resources = {"cpu": "100m"} if not gpus else {"cpu": "100m", "nvidia.com/gpu": str(gpus)}
    container = client.V1Container(
        name="server",
        image="server:1",
        ports=[client.V1ContainerPort(container_port=PORT)],
        env=[
            client.V1EnvVar(name=k, value=v)
            for k, v in {**env, "SANDBOX_READY_AFTER_SECONDS": "0"}.items()
        ],
        resources=client.V1ResourceRequirements(requests=resources, limits=resources),
    )
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels={"app": name}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": name}),
                spec=client.V1PodSpec(containers=[container]),
            ),
        ),
    )


def autoscaler(
    name: str, metric: client.V2MetricSpec, *, scale_down_window: int | None = None
) -> client.V2HorizontalPodAutoscaler:
    behavior = None
    if scale_down_window is not None:
        behavior = client.V2HorizontalPodAutoscalerBehavior(
            scale_down=client.V2HPAScalingRules(stabilization_window_seconds=scale_down_window)
        )
    return client.V2HorizontalPodAutoscaler(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V2HorizontalPodAutoscalerSpec(
            scale_target_ref=client.V2CrossVersionObjectReference(
                api_version="apps/v1", kind="Deployment", name=name
            ),
            min_replicas=1,
            max_replicas=3,
            metrics=[metric],
            behavior=behavior,
        ),
    )


def send_load(core: client.CoreV1Api, app: str, requests_per_pod: int) -> None:
    """A burst of real HTTP requests to every ready pod of ``app``."""
    for pod in core.list_namespaced_pod(NS, label_selector=f"app={app}").items:
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        if ready and pod.status.pod_ip:
            for _ in range(requests_per_pod):
                with urllib.request.urlopen(f"http://{pod.status.pod_ip}:{PORT}/v1/x", timeout=5):
                    pass


def load_until(kube_api, core, apps, app: str, replicas: int) -> set[int]:
    """Send load until the Deployment wants ``replicas``; the counts it wanted meanwhile."""
    seen = set()
    for _ in range(300):
        send_load(core, app, 4)
        kube_api.tick()
        seen.add(apps.read_namespaced_deployment(app, NS).spec.replicas)
        if replicas in seen:
            return seen
    raise AssertionError(f"never scaled to {replicas}: {seen}")


def conditions(hpa: client.V2HorizontalPodAutoscaler) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in hpa.status.conditions or []}


def test_cpu_autoscaler_scales_up_under_load_and_down_after_the_window(kube_api, apis):
    core, apps, scaling = apis
    apps.create_namespaced_deployment(NS, serving("web", env={"SANDBOX_CPU_MS_PER_REQUEST": "50"}))
    cpu = client.V2MetricSpec(
        type="Resource",
        resource=client.V2ResourceMetricSource(
            name="cpu", target=client.V2MetricTarget(type="Utilization", average_utilization=50)
        ),
    )
    scaling.create_namespaced_horizontal_pod_autoscaler(NS, autoscaler("web", cpu))
    idle = kube_api.wait_for(
        lambda: (
            (
                h := scaling.read_namespaced_horizontal_pod_autoscaler("web", NS)
            ).status.current_metrics
            and h
        )
    )
    assert idle.status.current_metrics[0].resource.current.average_utilization == 0
    assert conditions(idle)["ScalingActive"] == ("True", "ValidMetricFound")
    assert max(load_until(kube_api, core, apps, "web", 3)) == 3
    hpa = scaling.read_namespaced_horizontal_pod_autoscaler("web", NS)
    assert hpa.status.desired_replicas == 3 and hpa.status.last_scale_time is not None
    assert hpa.status.current_metrics[0].resource.current.average_utilization > 50
    assert conditions(hpa)["ScalingLimited"] == ("True", "TooManyReplicas")
    kube_api.wait_for(lambda: len(core.list_namespaced_pod(NS).items) == 3)
    # Idle now: the proposal falls to the minimum, held by the 300 s window.
    kube_api.wait_for(
        lambda: (
            scaling.read_namespaced_horizontal_pod_autoscaler("web", NS)
            .status.current_metrics[0]
            .resource.current.average_utilization
            == 0
        ),
        timeout=10,
    )
    assert scaling.read_namespaced_horizontal_pod_autoscaler("web", NS).status.desired_replicas == 3
    assert apps.read_namespaced_deployment("web", NS).spec.replicas == 3
    kube_api.advance_clock(301)
    kube_api.wait_for(lambda: apps.read_namespaced_deployment("web", NS).spec.replicas == 1)
    hpa = scaling.read_namespaced_horizontal_pod_autoscaler("web", NS)
    assert conditions(hpa)["ScalingLimited"] == ("True", "TooFewReplicas")
    assert conditions(hpa)["AbleToScale"] == ("True", "SucceededRescale")
    events = core.list_namespaced_event(NS, field_selector="reason=SuccessfulRescale").items
    assert sorted(e.message.split(";")[0] for e in events) == ["New size: 1", "New size: 3"]


def test_gpu_utilization_autoscaler_with_a_short_scale_down_window(kube_api, apis):
    core, apps, scaling = apis
    apps.create_namespaced_deployment(
        NS, serving("llm", env={"SANDBOX_GPU_MS_PER_REQUEST": "200"}, gpus=1)
    )
    gpu = client.V2MetricSpec(
        type="Pods",
        pods=client.V2PodsMetricSource(
            metric=client.V2MetricIdentifier(name="gpu_utilization"),
            target=client.V2MetricTarget(type="AverageValue", average_value="50"),
        ),
    )
    scaling.create_namespaced_horizontal_pod_autoscaler(
        NS, autoscaler("llm", gpu, scale_down_window=1)
    )
    assert max(load_until(kube_api, core, apps, "llm", 3)) == 3
    hpa = scaling.read_namespaced_horizontal_pod_autoscaler("llm", NS)
    assert int(hpa.status.current_metrics[0].pods.current.average_value) > 50
    kube_api.wait_for(lambda: apps.read_namespaced_deployment("llm", NS).spec.replicas == 1, 15)
    pods = kube_api.wait_for(
        lambda: len(found := core.list_namespaced_pod(NS).items) == 1 and found
    )
    assert pods[0].spec.containers[0].resources.requests["nvidia.com/gpu"] == "1"


def test_autoscaler_of_a_deployment_at_zero_is_disabled(kube_api, apis):
    _, apps, scaling = apis
    deployment = serving("idle", env={})
    deployment.spec.replicas = 0
    apps.create_namespaced_deployment(NS, deployment)
    scaling.create_namespaced_horizontal_pod_autoscaler(
        NS,
        autoscaler(
            "idle",
            client.V2MetricSpec(
                type="External",
                external=client.V2ExternalMetricSource(
                    metric=client.V2MetricIdentifier(name="gpu_utilization"),
                    target=client.V2MetricTarget(type="Value", value="60"),
                ),
            ),
        ),
    )
    hpa = kube_api.wait_for(
        lambda: (
            (h := scaling.read_namespaced_horizontal_pod_autoscaler("idle", NS)).status.conditions
            and h
        )
    )
    assert conditions(hpa)["ScalingActive"] == ("False", "ScalingDisabled")
    assert hpa.spec.min_replicas == 1 and hpa.status.desired_replicas == 0
    assert apps.read_namespaced_deployment("idle", NS).spec.replicas == 0
