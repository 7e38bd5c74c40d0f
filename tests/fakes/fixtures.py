"""Pytest fixtures for the doubles the tests talk real protocols to (the Kubernetes
simulator of `sandbox.kubesim`), registered once by `pytest_plugins` in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobs.backends.kubernetes.namespaces import namespaces_forget_all
from sandbox.kubesim import KubeAPIServer


@pytest.fixture
def kube_api() -> Iterator[KubeAPIServer]:
    """A started :class:`KubeAPIServer` (auto-ticking controller every 50 ms)."""
    server = KubeAPIServer()
    server.start()
    namespaces_forget_all()  # a fresh cluster: no namespace of an earlier test exists
    try:
        yield server
    finally:
        server.stop()
    if server.errors:
        pytest.fail("fake kube-apiserver errors:\n" + "\n".join(server.errors), pytrace=False)
