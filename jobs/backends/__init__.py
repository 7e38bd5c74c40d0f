"""Compute backends: where GPU work runs (the local host, or a Kubernetes cluster)."""

from __future__ import annotations

from jobs.backends.base import BackendUnavailable, ComputeBackend, NodeInventory

__all__ = ["BackendUnavailable", "ComputeBackend", "NodeInventory", "get_backend"]


def get_backend(name: str) -> ComputeBackend:
    if name == "local":
        from jobs.backends.local import LocalBackend

        return LocalBackend()
    if name == "kubernetes":
        from jobs.backends.kubernetes import KubernetesBackend

        return KubernetesBackend.from_settings()
    raise ValueError(f"unknown compute backend {name!r}")
