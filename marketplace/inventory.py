"""What a place where work runs reports about its nodes, in backend-neutral terms.

The marketplace's capacity sync reads it into node pools; the compute backends (in jobs,
above the marketplace) produce it, so the type lives here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class NodeInventory:
    """One node as the backend reports it, in backend-neutral terms."""

    name: str
    region: str
    tier: str  # on_demand | spot | reserved
    labels: dict[str, str] = field(default_factory=dict)
    gpu_resource: str | None = None  # e.g. "nvidia.com/gpu"
    gpu_product: str | None = None  # e.g. "NVIDIA-H100-80GB-HBM3" or an NVML name
    gpus_allocatable: int = 0
    gpus_in_use: int = 0
    vcpus_allocatable: int = 0
    vcpus_in_use: int = 0
    memory_gib: int = 0
    schedulable: bool = True
    ready: bool = True  # Kubernetes' Ready condition: False when the node stopped answering


# What node labels say about the hardware (Kubernetes' well-known labels, GPU feature
# discovery's, and the plain `nvlink: "true"` / `network: rdma` labels the platform's
# node documents use).
ARCH_LABEL = "kubernetes.io/arch"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU
INTERCONNECTS = ("nvlink", "rdma", "infiniband")
CPU_ARCHES = ("amd64", "arm64")
_TRUE = {"true", "yes", "1"}


def node_interconnects(labels: dict[str, str]) -> set[str]:
    found = set()
    if labels.get("nvlink", "").lower() in _TRUE or labels.get("nvidia.com/gpu.nvlink"):
        found.add("nvlink")
    network = labels.get("network", "").lower()
    if network in ("rdma", "infiniband"):
        found.add(network)
    if labels.get("feature.node.kubernetes.io/rdma.capable", "").lower() in _TRUE:
        found.add("rdma")
    if network == "infiniband":
        found.add("rdma")  # InfiniBand is RDMA-capable
    return found


def node_gpu_memory_gib(labels: dict[str, str]) -> int:
    """GPU memory per GPU from GPU feature discovery's label (MiB), rounded; 0: unknown."""
    try:
        return round(int(labels.get(GPU_MEMORY_LABEL, "0")) / 1024)
    except ValueError:
        return 0


class InventorySource(Protocol):
    """Anything that reports nodes: a compute backend."""

    name: str
    # Its nodes are the console's own machine: capacity sync marks its pools so, and only
    # tenants staff allow to run on the host see or use them.
    runs_on_console_host: bool
    # Its nodes are simulated (the sandbox cluster): its pools and jobs say so.
    simulated: bool

    def inventory(self) -> list[NodeInventory]: ...
