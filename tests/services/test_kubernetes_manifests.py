"""Golden tests of a service's Kubernetes objects (no cluster, no database).

The JSON files under tests/services/golden/ are the reviewed output; after an intended
change regenerate them with `GOLDEN_UPDATE=1 pytest tests/services/test_kubernetes_manifests.py`
and review the diff.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from console.models import Tenant
from jobs.extensions import VolumeMount
from marketplace.models import GpuType, NodePool, Region
from services.kubernetes import manifests
from services.models import Service, ServiceRevision
from tests.jobs.test_kubernetes_manifests import assert_golden as jobs_assert_golden

GOLDEN = "../../services/golden/"


@pytest.fixture(autouse=True)
def pinned_settings(settings):
    settings.KUBERNETES_EPHEMERAL_STORAGE = "20Gi"
    settings.GPUGEEK_INSTALLATION_ID = "gg-golden"
    return settings


def service(**overrides) -> tuple[Service, ServiceRevision]:
    region = Region(pk=1, slug="us-west", name="US West")
    pool = NodePool(
        pk=11,
        slug="kubernetes-us-west-cpu-on-demand",
        region=region,
        backend="kubernetes",
        tier="on_demand",
        vcpus_per_node=32,
        memory_gib_per_node=128,
        node_selector={"gpugeek.io/pool": "cpu"},
    )
    values = {
        "pk": 42,
        "tenant": Tenant(pk=7, slug="acme", name="Acme"),
        "name": "chat",
        "region": region,
        "pool": pool,
        "image": "vllm-0-6",
        "command": ["python", "-m", "server", "--port", "8000"],
        "env": {"MODEL": "llama-3-8b", "LOG_LEVEL": "info"},
        "secrets": ["HF_TOKEN"],
        "port": 8000,
        "cpus": 2,
        "min_replicas": 2,
        "max_replicas": 10,
        "readiness_path": "/healthz",
        "autoscale_metric": "concurrency",
        "autoscale_target": 10.0,
        "scale_down_delay": 300,
        "priority": "normal",
        **overrides,
    }
    svc = Service(**values)
    revision = ServiceRevision(
        service=svc,
        number=3,
        image=svc.image,
        command=svc.command,
        env=svc.env,
        secrets=svc.secrets,
        port=svc.port,
        cpus=svc.cpus,
        gpus_per_replica=svc.gpus_per_replica,
    )
    return svc, revision


def gpu_service(**overrides) -> tuple[Service, ServiceRevision]:
    h100 = GpuType(
        pk=3,
        slug="h100-80gb",
        model="H100 80GB SXM",
        node_label_key="nvidia.com/gpu.product",
        node_label_value="NVIDIA-H100-80GB-HBM3",
        resource_name="nvidia.com/gpu",
    )
    pool = NodePool(
        pk=12,
        slug="kubernetes-us-west-h100-on-demand",
        region=Region(pk=1, slug="us-west", name="US West"),
        backend="kubernetes",
        tier="on_demand",
        gpu_type=h100,
        gpus_per_node=8,
        vcpus_per_node=208,
        memory_gib_per_node=1800,
        node_selector={"gpugeek.io/pool": "h100"},
    )
    values = {"pool": pool, "gpu_type": h100, "gpus_per_replica": 2, "cpus": 8}
    return service(**{**values, **overrides})


WEIGHTS = VolumeMount(
    volume_id=5, name="weights", path="/models", read_only=True, size_gib=100, shared=True
)


def rendered(svc: Service, revision: ServiceRevision, volumes=(WEIGHTS,)) -> dict:
    secret = manifests.secret_name(svc, revision)
    out = {
        "deployment": manifests.deployment_manifest(
            svc,
            revision,
            image_reference="vllm/vllm-openai:v0.6.3",
            replicas=2,
            secret=secret,
            volumes=list(volumes),
        ),
        "service": manifests.service_manifest(svc, revision),
        "network_policy": manifests.network_policy_manifest(svc, revision),
        "secret": manifests.secret_manifest(svc, revision, {"HF_TOKEN": "hf_x"}),
    }
    if manifests.uses_hpa(svc):
        out["hpa"] = manifests.hpa_manifest(svc)
    return out


def test_console_scaled_service_matches_golden():
    assert_golden("kubernetes_service_concurrency.json", rendered(*service()))


def test_cpu_scaled_service_matches_golden():
    svc, revision = service(autoscale_metric="cpu", autoscale_target=70.0, priority="critical")
    assert_golden("kubernetes_service_cpu_hpa.json", rendered(svc, revision, volumes=()))


def test_gpu_scaled_service_matches_golden():
    svc, revision = gpu_service(autoscale_metric="gpu", autoscale_target=60.0)
    assert_golden("kubernetes_service_gpu_hpa.json", rendered(svc, revision))


def test_gpu_replicas_ask_for_their_gpus_on_nodes_of_their_type():
    svc, revision = gpu_service()
    pod = rendered(svc, revision)["deployment"]["spec"]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "2" and limits["cpu"] == "8"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    # A revision without GPUs (a CPU service) asks for none and tolerates nothing.
    cpu = rendered(*service())["deployment"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu["containers"][0]["resources"]["limits"]
    assert "tolerations" not in cpu


def test_a_gpu_hpa_reads_the_pods_gpu_utilisation():
    svc, _ = gpu_service(autoscale_metric="gpu", autoscale_target=60.0, min_replicas=1)
    metric = manifests.hpa_manifest(svc)["spec"]["metrics"]
    assert metric == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "gpu_utilization"},
                "target": {"type": "AverageValue", "averageValue": "60"},
            },
        }
    ]


def test_every_pod_mounts_the_volumes_claims_read_only():
    svc, revision = service()
    pod = rendered(svc, revision)["deployment"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "vol-0", "persistentVolumeClaim": {"claimName": "gg-vol-5", "readOnly": True}}
    ]
    mounts = pod["containers"][0]["volumeMounts"]
    assert mounts == [{"name": "vol-0", "mountPath": "/models", "readOnly": True}]
    without = rendered(svc, revision, volumes=())["deployment"]["spec"]["template"]["spec"]
    assert "volumes" not in without and "volumeMounts" not in without["containers"][0]


def assert_golden(name: str, value: dict) -> None:
    jobs_assert_golden(GOLDEN + name, value)


def test_every_field_is_a_real_api_field():
    """A typo'd key would be dropped by a real API server: round-trip through the official
    client's models and lose nothing."""
    api = client.ApiClient()
    models = {
        "Deployment": client.V1Deployment,
        "Service": client.V1Service,
        "NetworkPolicy": client.V1NetworkPolicy,
        "Secret": client.V1Secret,
        "HorizontalPodAutoscaler": client.V2HorizontalPodAutoscaler,
    }
    for svc, revision in (
        service(autoscale_metric="cpu", autoscale_target=70.0),
        gpu_service(autoscale_metric="gpu", autoscale_target=60.0),
    ):
        for obj in rendered(svc, revision).values():
            model = models[obj["kind"]].from_dict(obj)
            assert api.sanitize_for_serialization(model) == obj, obj["kind"]


def test_the_pods_are_restricted_and_reached_only_from_the_gateway():
    svc, revision = service()
    objects = rendered(svc, revision)
    pod = objects["deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    # The secret's value is never in the Deployment, only a reference to it.
    env = {e["name"]: e for e in container["env"]}
    assert env["PORT"] == {"name": "PORT", "value": "8000"}
    assert "value" not in env["HF_TOKEN"]
    reference = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": "gg-svc-42-r3", "key": "HF_TOKEN"}
    rule = objects["network_policy"]["spec"]["ingress"]
    assert rule == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "gpugeek"}
                    },
                    "podSelector": {
                        "matchLabels": {"app.kubernetes.io/name": "gpugeek"},
                        "matchExpressions": [
                            {
                                "key": "app.kubernetes.io/component",
                                "operator": "In",
                                "values": ["web"],
                            }
                        ],
                    },
                }
            ],
            "ports": [{"protocol": "TCP", "port": 8000}],
        }
    ]
    strategy = objects["deployment"]["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxSurge": 1, "maxUnavailable": 0}


def test_an_hpa_never_scales_to_zero_and_waits_the_scale_down_delay():
    svc, _ = service(autoscale_metric="cpu", autoscale_target=65.0, min_replicas=0)
    hpa = manifests.hpa_manifest(svc)
    assert hpa["spec"]["minReplicas"] == 1
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    target = hpa["spec"]["metrics"][0]["resource"]["target"]
    assert target == {"type": "Utilization", "averageUtilization": 65}
