"""Compute backends: where GPU work runs (the local host, or a Kubernetes cluster)."""

from __future__ import annotations

from jobs.backends.base import (
    BackendRejected,
    BackendUnavailable,
    ComputeBackend,
    NodeInventory,
    Observation,
)

__all__ = [
    "BackendRejected",
    "BackendUnavailable",
    "ComputeBackend",
    "NodeInventory",
    "Observation",
    "get_backend",
]


def get_backend(name: str) -> ComputeBackend:
    if name == "local":
        from jobs.backends.local import LocalBackend

        return LocalBackend()
    if name == "kubernetes":
        from jobs.backends.kubernetes import KubernetesBackend

        return KubernetesBackend.from_settings()
    raise ValueError(f"unknown compute backend {name!r}")
