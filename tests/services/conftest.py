"""Fixtures of the services tests: a spec that runs the echo server, the cleanup of
every replica process a test started, and reading the gateway's /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.backends import host_processes
from services import reconcile
from services.models import ReplicaState, Service
from services.services import ServiceSpec
from tests.services.echo import COMMAND


def echo_spec(**overrides) -> ServiceSpec:
    values = {
        "name": "echo",
        "image": "python:3.11-slim",
        "command": COMMAND,
        "port": 8080,
        "region": "local",
        "min_replicas": 2,
        "max_replicas": 4,
        "readiness_path": "/healthz",
        # Replicas go as soon as the traffic says (test_autoscaling sets a delay of its own).
        "scale_down_delay": 0,
    }
    values.update(overrides)
    return ServiceSpec(**values)


@pytest.fixture
def replicas_cleanup():
    """Stop and remove every replica process the test started (found by their run
    directories: the rows may be gone, and the database with them)."""
    yield
    root = host_processes.run_dir("x").parent
    for directory in root.glob("service-*") if root.exists() else []:
        reconcile.replica_discard(directory.name)


def reconcile_until(
    service: Service, done: Callable[[Service], bool], *, timeout: float = 30
) -> Service:
    """Reconcile passes (as beat would run them) until `done`, bounded in time."""
    deadline = time.monotonic() + timeout
    while True:
        fresh = reconcile.service_reconcile(service_id=service.pk)
        assert fresh is not None
        if done(fresh):
            return fresh
        if time.monotonic() > deadline:
            states = list(fresh.replicas.values_list("state", "reason"))
            raise AssertionError(f"timed out: {fresh.status} {fresh.status_reason} {states}")
        time.sleep(0.2)


def ready_count(service: Service) -> int:
    return service.replicas.filter(state=ReplicaState.READY).count()


METRICS_TOKEN = "gateway-metrics-token-0123456789"  # the gateway servers' METRICS_TOKEN


def scraped(client: httpx.Client) -> dict[tuple[str, tuple], float]:
    """The console's /metrics as {(sample name, sorted labels): value}."""
    answer = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert answer.status_code == 200, answer.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def metric_value(metrics: dict, name: str, **labels: str) -> float | None:
    return metrics.get((name, tuple(sorted(labels.items()))))
