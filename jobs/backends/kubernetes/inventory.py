"""Nodes and their GPU, vCPU and memory capacity and use, in backend-neutral terms."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.conf import settings
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from jobs.backends.base import (
    BackendUnavailable,
    NodeInventory,
)
from jobs.backends.kubernetes.client import (
    ACTIVE_POD_PHASES,
    GPU_PRODUCT_LABELS,
    GPU_RESOURCES,
    REGION_LABEL,
    ApiCalls,
    node_tier,
    parse_cpu,
    parse_memory_gib,
    parse_millicores,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class InventoryMixin(ApiCalls):
    def inventory(self) -> list[NodeInventory]:
        timeout = settings.KUBERNETES_REQUEST_TIMEOUT
        try:
            nodes = self.core.list_node(_request_timeout=timeout).items
            pods = self.core.list_pod_for_all_namespaces(_request_timeout=timeout).items
        except (ApiException, HTTPError, OSError) as error:
            raise BackendUnavailable(f"listing nodes failed: {error}") from error

        gpus_used: dict[str, int] = {}
        millicores_used: dict[str, int] = {}
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
                # Summed in millicores: each small request must count (4 × 500m = 2).
                millicores_used[node_name] = millicores_used.get(node_name, 0) + parse_millicores(
                    requests.get("cpu")
                )

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
                    # Rounded up: a vCPU partly taken is not free.
                    vcpus_in_use=-(-millicores_used.get(name, 0) // 1000),
                    memory_gib=parse_memory_gib(allocatable.get("memory")),
                    schedulable=not (node.spec and node.spec.unschedulable),
                    ready=any(
                        c.type == "Ready" and c.status == "True"
                        for c in (node.status.conditions or [] if node.status else [])
                    ),
                )
            )
        return inventory
