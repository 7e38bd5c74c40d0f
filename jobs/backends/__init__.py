"""Compute backends: where GPU work runs (the local host, or a Kubernetes cluster).

A registry names each backend's factory; `get_backend(job.backend)` builds it anew on
each call (a backend is cheap to build and holds no state between calls). A third backend
plugs in with `register_backend("name", "dotted.path.To.Backend")` (or a callable): code
outside this package only ever asks the `ComputeBackend` interface.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.utils.module_loading import import_string

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
    "configured_backends",
    "get_backend",
    "register_backend",
]

BackendFactory = type[ComputeBackend] | Callable[[], ComputeBackend]

# Dotted paths are imported on first use, so importing this package loads no backend
# (and its client libraries) that the installation doesn't configure.
_FACTORIES: dict[str, str | BackendFactory] = {
    "local": "jobs.backends.local.LocalBackend",
    "kubernetes": "jobs.backends.kubernetes.KubernetesBackend",
}


def register_backend(name: str, factory: str | BackendFactory) -> None:
    """Make `name` (the value of `Job.backend` and COMPUTE_BACKENDS) build backends with
    `factory`: a ComputeBackend class (built with `from_settings()`), a callable returning
    a backend, or the dotted path of either."""
    _FACTORIES[name] = factory


def get_backend(name: str) -> ComputeBackend:
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown compute backend {name!r}")
    if isinstance(factory, str):
        factory = _FACTORIES[name] = import_string(factory)
    if isinstance(factory, type) and issubclass(factory, ComputeBackend):
        return factory.from_settings()
    return factory()


def configured_backends() -> list[ComputeBackend]:
    """A backend for each name in settings.COMPUTE_BACKENDS, in that order."""
    return [get_backend(name) for name in settings.COMPUTE_BACKENDS]
