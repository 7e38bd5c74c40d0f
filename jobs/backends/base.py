"""The interface every compute backend implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class BackendUnavailable(Exception):
    """The backend can't be reached right now (API down, timeout): retry later."""


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


class ComputeBackend(Protocol):
    name: str

    def inventory(self) -> list[NodeInventory]:
        """Every node this backend can place work on, with capacity and current use."""
        ...
