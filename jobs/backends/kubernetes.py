"""The Kubernetes backend, through the official client (KUBECONFIG or in-cluster)."""

from __future__ import annotations

import logging

from django.conf import settings
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from jobs.backends.base import BackendUnavailable, NodeInventory

log = logging.getLogger(__name__)

REGION_LABEL = "topology.kubernetes.io/region"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910")
GPU_PRODUCT_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name", "accelerator")
# Labels (key, value) that clouds and autoscalers put on spot/preemptible nodes.
SPOT_LABELS = {
    ("gpugeek.io/tier", "spot"),
    ("cloud.google.com/gke-spot", "true"),
    ("cloud.google.com/gke-preemptible", "true"),
    ("eks.amazonaws.com/capacityType", "SPOT"),
    ("karpenter.sh/capacity-type", "spot"),
    ("kubernetes.azure.com/scalesetpriority", "spot"),
    ("node.kubernetes.io/lifecycle", "spot"),
}
SPOT_TAINT_KEYS = {
    "gpugeek.io/spot",
    "cloud.google.com/gke-spot",
    "kubernetes.azure.com/scalesetpriority",
}
ACTIVE_POD_PHASES = {"Pending", "Running", "Unknown"}


def parse_cpu(quantity: str | None) -> int:
    if not quantity:
        return 0
    if quantity.endswith("m"):
        return int(quantity[:-1]) // 1000
    return int(float(quantity))


def parse_memory_gib(quantity: str | None) -> int:
    if not quantity:
        return 0
    units = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "K": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor // 2**30)
    return int(quantity) // 2**30


def node_tier(labels: dict[str, str], taints: list) -> str:
    if labels.get("gpugeek.io/tier") in ("on_demand", "reserved"):
        return labels["gpugeek.io/tier"]
    if any((key, labels.get(key)) in SPOT_LABELS for key in labels):
        return "spot"
    if any(taint.key in SPOT_TAINT_KEYS for taint in taints or []):
        return "spot"
    return "on_demand"


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, api_client: client.ApiClient):
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)

    @classmethod
    def from_settings(cls) -> KubernetesBackend:
        configuration = client.Configuration()
        try:
            if settings.KUBECONFIG:
                config.load_kube_config(
                    config_file=settings.KUBECONFIG, client_configuration=configuration
                )
            else:
                config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as error:
            raise BackendUnavailable(f"Kubernetes is not configured: {error}") from error
        return cls(client.ApiClient(configuration))

    def inventory(self) -> list[NodeInventory]:
        timeout = settings.KUBERNETES_REQUEST_TIMEOUT
        try:
            nodes = self.core.list_node(_request_timeout=timeout).items
            pods = self.core.list_pod_for_all_namespaces(_request_timeout=timeout).items
        except (ApiException, HTTPError, OSError) as error:
            raise BackendUnavailable(f"listing nodes failed: {error}") from error

        gpus_used: dict[str, int] = {}
        cpus_used: dict[str, int] = {}
        for pod in pods:
            node_name = pod.spec.node_name if pod.spec else None
            if not node_name or (pod.status and pod.status.phase not in ACTIVE_POD_PHASES):
                continue
            for container in pod.spec.containers or []:
                requests = (container.resources.requests or {}) if container.resources else {}
                limits = (container.resources.limits or {}) if container.resources else {}
                for resource in GPU_RESOURCES:
                    amount = limits.get(resource) or requests.get(resource)
                    if amount:
                        gpus_used[node_name] = gpus_used.get(node_name, 0) + int(amount)
                cpus_used[node_name] = cpus_used.get(node_name, 0) + parse_cpu(requests.get("cpu"))

        inventory = []
        for node in nodes:
            labels = node.metadata.labels or {}
            allocatable = (node.status.allocatable or {}) if node.status else {}
            resource = next((r for r in GPU_RESOURCES if int(allocatable.get(r, 0) or 0)), None)
            product = next((labels[k] for k in GPU_PRODUCT_LABELS if k in labels), None)
            name = node.metadata.name
            inventory.append(
                NodeInventory(
                    name=name,
                    region=labels.get(REGION_LABEL, ""),
                    tier=node_tier(labels, node.spec.taints if node.spec else []),
                    labels=labels,
                    gpu_resource=resource,
                    gpu_product=product if resource else None,
                    gpus_allocatable=int(allocatable.get(resource, 0)) if resource else 0,
                    gpus_in_use=gpus_used.get(name, 0),
                    vcpus_allocatable=parse_cpu(allocatable.get("cpu")),
                    vcpus_in_use=cpus_used.get(name, 0),
                    memory_gib=parse_memory_gib(allocatable.get("memory")),
                    schedulable=not (node.spec and node.spec.unschedulable),
                )
            )
        return inventory
