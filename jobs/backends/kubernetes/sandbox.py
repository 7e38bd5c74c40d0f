"""The sandbox cluster as the Kubernetes backend sees it: the simulated nodes its pools
need, the kubeconfig that points the official client at it, and its chaos controls.

The sandbox itself (`sandbox/`, its own process) is a simulated Kubernetes API server;
this backend talks to it exactly as to a real cluster. Only the chaos controls, which a
real cluster doesn't have, use the sandbox's own `/sandbox/v1/` API.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings

from console.env import write_private
from jobs.backends.base import BackendUnavailable, ChaosControls, ChaosRefused
from jobs.backends.kubernetes.client import REGION_LABEL
from marketplace.inventory import ARCH_LABEL, GPU_MEMORY_LABEL
from marketplace.models import NodePool

POOL_LABEL = "gpugeek.io/pool"
TIER_LABEL = "gpugeek.io/tier"
CONTROL_TIMEOUT_SECONDS = 10
SANDBOX_RACK_NODES = 8


def sandbox_nodes(pools: Iterable[NodePool]) -> list[dict]:
    """One simulated node per node of each pool, labelled so that capacity sync finds
    the pool again (region, tier, GPU product, the pool's own selector)."""
    nodes = []
    for pool in pools:
        labels = {
            REGION_LABEL: pool.region.slug,
            TIER_LABEL: pool.tier,
            POOL_LABEL: pool.slug,
            **{str(k): str(v) for k, v in (pool.node_selector or {}).items()},
        }
        allocatable = {
            "cpu": str(pool.vcpus_per_node or 8),
            "memory": f"{pool.memory_gib_per_node or 64}Gi",
            "ephemeral-storage": "2Ti",
        }
        if pool.gpu_type is not None:
            labels[pool.gpu_type.node_label_key] = pool.gpu_type.node_label_value
            allocatable[pool.gpu_type.resource_name] = str(pool.gpus_per_node)
            labels[GPU_MEMORY_LABEL] = str(pool.memory_per_gpu_gib * 1024)
        labels.update(_hardware_labels(pool))
        for index in range(pool.node_count):
            # Racks of SANDBOX_RACK_NODES consecutive nodes: the pool's topology blocks.
            rack = {pool.topology_label: f"{pool.region.slug}-rack-{index // SANDBOX_RACK_NODES}"}
            nodes.append(
                {
                    "name": f"{pool.slug}-{index}"[:63],
                    "labels": {**labels, **rack},
                    "allocatable": allocatable,
                }
            )
    return nodes


def _hardware_labels(pool: NodePool) -> dict[str, str]:
    """The node labels that say what the pool's nodes have (marketplace.inventory reads
    them back): its interconnects and CPU architecture."""
    labels = {ARCH_LABEL: pool.cpu_arch or "amd64"}
    if "nvlink" in pool.interconnects:
        labels["nvlink"] = "true"
    if "infiniband" in pool.interconnects:
        labels["network"] = "infiniband"
    elif "rdma" in pool.interconnects:
        labels["network"] = "rdma"
    return labels


def write_sandbox_files(*, nodes_file: Path, kubeconfig_file: Path, url: str, token: str) -> int:
    """The sandbox's nodes (written from the Kubernetes pools when the file is missing,
    so that an edited file is kept: that is how sizes are configured) and a kubeconfig
    for the console's processes. Returns the number of nodes."""
    if not nodes_file.exists():
        pools = NodePool.objects.filter(backend="kubernetes", is_active=True).select_related(
            "region", "gpu_type"
        )
        nodes_file.write_text(json.dumps(sandbox_nodes(pools), indent=1))
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sandbox", "cluster": {"server": url}}],
        "users": [{"name": "sandbox", "user": {"token": token}}],
        "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "sandbox"}}],
        "current-context": "sandbox",
    }
    write_private(kubeconfig_file, json.dumps(kubeconfig))
    return len(json.loads(nodes_file.read_text()))


class SandboxControls(ChaosControls):
    """The sandbox's chaos API (`/sandbox/v1/`), as staff drive it from the console."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def _call(self, method: str, path: str, payload: dict | None = None) -> dict[str, Any]:
        try:
            response = httpx.request(
                method,
                f"{self.url}/sandbox/v1/{path}",
                json=payload,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=CONTROL_TIMEOUT_SECONDS,
            )
        except httpx.HTTPError as error:
            raise BackendUnavailable(f"the sandbox cluster can't be reached: {error}") from error
        try:
            body = response.json()
        except ValueError:
            body = {"error": response.text[:200]}
        if response.status_code == 400:
            raise ChaosRefused(body.get("error", "refused"))
        if response.status_code != 200:
            raise BackendUnavailable(
                f"the sandbox cluster answered {response.status_code}: {body.get('error', '')}"
            )
        return body

    def nodes(self) -> list[dict]:
        return self._call("GET", "nodes")["nodes"]

    def reclaim_spot(self, pool_slug: str) -> dict:
        return self._call("POST", "reclaim-spot", {"pool": pool_slug})

    def fail_node(self, node: str) -> dict:
        return self._call("POST", "fail-node", {"node": node})

    def recover_node(self, node: str) -> dict:
        return self._call("POST", "recover-node", {"node": node})

    def xid_error(self, node: str, code: int) -> dict:
        return self._call("POST", "xid-error", {"node": node, "code": code})

    def stuck_gpus(self, node: str) -> dict:
        return self._call("POST", "stuck-gpus", {"node": node})

    def api_faults(self, *, mode: str, fraction: float, seconds: float, delay: float) -> dict:
        return self._call(
            "POST",
            "api-faults",
            {"mode": mode, "fraction": fraction, "seconds": seconds, "delay": delay},
        )

    def clear_api_faults(self) -> dict:
        return self._call("DELETE", "api-faults")


def sandbox_controls() -> SandboxControls | None:
    if not settings.SANDBOX_URL:
        return None
    return SandboxControls(settings.SANDBOX_URL, settings.SANDBOX_TOKEN)
