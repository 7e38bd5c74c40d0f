"""Fixtures of the services tests: a spec that runs the echo server, the cleanup of
every replica process a test started, and reading the gateway's /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from console.launcher import asgi_server_argv, free_loopback_port
from jobs.backends import host_processes
from jobs.backends.kubernetes import KubernetesBackend
from marketplace.demo import seed_catalog
from marketplace.models import NodePool
from marketplace.services import capacity_sync
from services import reconcile
from services.models import ReplicaState, Service
from services.services import ServiceSpec
from tests.servers import served
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


REGION = {"topology.kubernetes.io/region": "us-west"}
H100_PRODUCT = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture
def cluster(transactional_db, kube_api, settings, tmp_path):
    """A CPU node in us-west, synced into a Kubernetes pool; the console configured for
    the cluster."""
    seed_catalog()
    NodePool.objects.filter(slug__startswith="demo-").update(is_active=False)
    kube_api.add_node("cpu-1", labels=REGION, allocatable={"cpu": "32", "memory": "128Gi"})
    capacity_sync(backend=KubernetesBackend(kube_api.api_client()))
    settings.KUBECONFIG = str(kube_api.kubeconfig_path(tmp_path))
    settings.KUBERNETES_REQUEST_TIMEOUT = 2
    settings.SERVICE_RECONCILE_INTERVAL = 1  # the pods' drain: 3 s (tests run passes often)
    return kube_api


@pytest.fixture
def apis(cluster):
    api = cluster.api_client()
    return client.AppsV1Api(api), client.CoreV1Api(api)


@pytest.fixture
def cluster_gateway(cluster, tmp_path):
    """The console's ASGI app (uvicorn, as deployed) in front of the cluster's services."""
    port = free_loopback_port()
    with (
        served("uvicorn", asgi_server_argv("127.0.0.1", port), port, tmp_path / "u.log") as server,
        httpx.Client(base_url=server.url, timeout=20) as http,
    ):
        yield http


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
