"""capacity_sync: pools per region × GPU type × tier from a backend's inventory, with the
local backend (CPU only here), a test double, and the fake Kubernetes API server."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
from django.conf import settings
from kubernetes import client

from jobs.backends import local
from jobs.backends.base import BackendUnavailable, NodeInventory
from jobs.backends.kubernetes import KubernetesBackend
from jobs.backends.local import LocalBackend
from marketplace.models import NodePool
from marketplace.selectors import offers
from marketplace.services import capacity_sync

H100_LABEL = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@dataclass
class FakeBackend:
    """An inventory double (marketplace.inventory.InventorySource, all capacity sync
    reads): `inventory()` returns whatever the test put in `nodes`."""

    nodes: list[NodeInventory] = field(default_factory=list)
    name: str = "fake"
    down: bool = False
    runs_on_console_host: bool = False
    simulated: bool = False

    def inventory(self) -> list[NodeInventory]:
        if self.down:
            raise BackendUnavailable("unreachable")
        return list(self.nodes)


def h100(name, *, region="us-west", tier="on_demand", in_use=0, schedulable=True):
    return NodeInventory(
        name=name,
        region=region,
        tier=tier,
        labels={**H100_LABEL, "topology.kubernetes.io/region": region},
        gpu_resource="nvidia.com/gpu",
        gpu_product="NVIDIA-H100-80GB-HBM3",
        gpus_allocatable=8,
        gpus_in_use=in_use,
        vcpus_allocatable=208,
        vcpus_in_use=16,
        memory_gib=1800,
        schedulable=schedulable,
    )


def pools(backend_name):
    """Pools the sync made (the demo catalog's stand-in pools share their keys)."""
    return {
        (p.region.slug, p.gpu_type.slug if p.gpu_type else None, p.tier): p
        for p in NodePool.objects.filter(
            backend=backend_name, slug__startswith=backend_name
        ).select_related("region", "gpu_type")
    }


# --- local backend ----


def test_local_backend_makes_a_cpu_pool_and_no_gpu_pool(catalog):
    assert local.nvml_gpu_names() == []  # this machine has no NVIDIA driver

    synced = capacity_sync(backend=LocalBackend())

    (pool,) = synced
    assert (pool.region.slug, pool.gpu_type, pool.tier, pool.backend) == (
        "local",
        None,
        "on_demand",
        "local",
    )
    # This host's vCPUs, times the configured overcommit for light local jobs.
    vcpus = os.cpu_count() * settings.LOCAL_CPU_OVERCOMMIT
    assert pool.allocatable_vcpus == pool.vcpus_per_node == vcpus
    assert pool.total_gpus == 0
    assert pool.last_synced_at is not None
    assert list(pools("local")) == [("local", None, "on_demand")]


def test_local_backend_recognises_nvml_names_by_whole_name(catalog, monkeypatch):
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA L40S"]
    monkeypatch.setattr(local, "nvml_gpu_names", lambda: names)

    capacity_sync(backend=LocalBackend())

    found = pools("local")
    assert found[("local", "h100-80gb", "on_demand")].total_gpus == 2
    assert found[("local", "l4", "on_demand")].total_gpus == 1
    assert found[("local", "l40s", "on_demand")].total_gpus == 1


# --- grouping, with a backend double ----


def test_nodes_group_into_pools_by_region_gpu_type_and_tier(catalog, caplog):
    backend = FakeBackend(
        nodes=[
            h100("a", in_use=3),
            h100("b", in_use=8),
            h100("c", tier="spot", in_use=1),
            h100("d", schedulable=False),  # cordoned: counts in total, not allocatable
            h100("e", region="eu-central"),
            h100("mars-1", region="mars"),  # unknown region: skipped
            NodeInventory(
                name="b300-1",
                region="us-west",
                tier="on_demand",
                gpu_resource="nvidia.com/gpu",
                gpu_product="NVIDIA-B300",  # unknown GPU: skipped, not counted as CPU
                gpus_allocatable=8,
                vcpus_allocatable=64,
            ),
            NodeInventory(
                name="cpu-1",
                region="us-east",
                tier="on_demand",
                vcpus_allocatable=64,
                vcpus_in_use=10,
            ),
            NodeInventory(name="cpu-2", region="us-east", tier="on_demand", vcpus_allocatable=32),
        ]
    )
    demo = {p.pk: p.total_gpus for p in NodePool.objects.all()}

    capacity_sync(backend=backend)

    found = pools("fake")
    assert set(found) == {
        ("us-west", "h100-80gb", "on_demand"),
        ("us-west", "h100-80gb", "spot"),
        ("eu-central", "h100-80gb", "on_demand"),
        ("us-east", None, "on_demand"),
    }
    on_demand = found[("us-west", "h100-80gb", "on_demand")]
    assert (on_demand.node_count, on_demand.gpus_per_node) == (3, 8)
    assert (on_demand.total_gpus, on_demand.allocatable_gpus, on_demand.in_use_gpus) == (24, 16, 11)
    assert on_demand.available_gpus == 5
    spot = found[("us-west", "h100-80gb", "spot")]
    assert (spot.total_gpus, spot.in_use_gpus, spot.available_gpus) == (8, 1, 7)
    cpu = found[("us-east", None, "on_demand")]
    assert (cpu.node_count, cpu.allocatable_vcpus, cpu.in_use_vcpus, cpu.vcpus_per_node) == (
        2,
        96,
        10,
        64,
    )
    assert "unknown region" in caplog.text and "unknown GPU" in caplog.text
    # Another backend's pools (the demo fleet) are untouched.
    assert {p.pk: p.total_gpus for p in NodePool.objects.exclude(backend="fake")} == demo


def test_synced_capacity_shows_in_offers(catalog):
    NodePool.objects.all().delete()
    capacity_sync(backend=FakeBackend(nodes=[h100("a", in_use=3), h100("c", tier="spot")]))

    (on_demand,) = offers(gpu_type="h100-80gb", region="us-west", tier="on_demand")
    (spot,) = offers(gpu_type="h100-80gb", region="us-west", tier="spot")
    (reserved,) = offers(gpu_type="h100-80gb", region="us-west", tier="reserved")
    assert (on_demand.available, spot.available, reserved.available) == (5, 8, 0)


def test_a_pool_whose_nodes_vanished_drops_to_zero(catalog):
    backend = FakeBackend(nodes=[h100("a", in_use=2), h100("c", tier="spot")])
    capacity_sync(backend=backend)
    first = pools("fake")

    backend.nodes = [h100("c", tier="spot", in_use=4)]
    capacity_sync(backend=backend)

    found = pools("fake")
    assert {k: p.pk for k, p in found.items()} == {k: p.pk for k, p in first.items()}
    gone = found[("us-west", "h100-80gb", "on_demand")]
    assert (gone.node_count, gone.total_gpus, gone.allocatable_gpus, gone.in_use_gpus) == (
        0,
        0,
        0,
        0,
    )
    assert gone.available_gpus == 0
    assert gone.last_synced_at > first[("us-west", "h100-80gb", "on_demand")].last_synced_at
    assert found[("us-west", "h100-80gb", "spot")].in_use_gpus == 4


def test_an_unreachable_backend_writes_nothing(catalog):
    backend = FakeBackend(nodes=[h100("a", in_use=2)])
    capacity_sync(backend=backend)
    before = {k: (p.total_gpus, p.in_use_gpus, p.last_synced_at) for k, p in pools("fake").items()}

    backend.down = True
    with pytest.raises(BackendUnavailable):
        capacity_sync(backend=backend)

    after = {k: (p.total_gpus, p.in_use_gpus, p.last_synced_at) for k, p in pools("fake").items()}
    assert after == before


def test_sync_is_idempotent(catalog):
    backend = FakeBackend(nodes=[h100("a", in_use=2), h100("c", tier="spot")])
    capacity_sync(backend=backend)
    first = {k: (p.pk, p.total_gpus, p.in_use_gpus) for k, p in pools("fake").items()}
    capacity_sync(backend=backend)
    assert {k: (p.pk, p.total_gpus, p.in_use_gpus) for k, p in pools("fake").items()} == first


# --- Kubernetes, through the fake API server ----


def h100_node(server, name, **labels):
    server.add_node(
        name,
        labels={**H100_LABEL, "topology.kubernetes.io/region": "us-west", **labels},
        allocatable={"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
    )


def gpu_pod(name, node, gpus):
    resources = client.V1ResourceRequirements(
        requests={"nvidia.com/gpu": gpus, "cpu": "4"}, limits={"nvidia.com/gpu": gpus}
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node,
            restart_policy="Never",
            containers=[client.V1Container(name="main", image="busybox:1.36", resources=resources)],
        ),
    )


def test_kubernetes_nodes_and_pods_become_pools(catalog, kube_api):
    h100_node(kube_api, "h100-a")
    h100_node(kube_api, "h100-b", **{"karpenter.sh/capacity-type": "spot"})
    core = client.CoreV1Api(kube_api.api_client())
    core.create_namespaced_pod("default", gpu_pod("train-0", "h100-a", "2"))
    core.create_namespaced_pod("default", gpu_pod("done-0", "h100-b", "4"))
    kube_api.wait_for(
        lambda: kube_api.get("pods", "default", "done-0")["status"]["phase"] == "Running"
    )
    kube_api.succeed_pod("default", "done-0")  # finished pods hold no GPUs

    capacity_sync(backend=KubernetesBackend(kube_api.api_client()))

    found = pools("kubernetes")
    on_demand = found[("us-west", "h100-80gb", "on_demand")]
    spot = found[("us-west", "h100-80gb", "spot")]
    assert (on_demand.node_count, on_demand.total_gpus, on_demand.in_use_gpus) == (1, 8, 2)
    assert (spot.node_count, spot.total_gpus, spot.in_use_gpus) == (1, 8, 0)
    assert (on_demand.available_gpus, spot.available_gpus) == (6, 8)
    assert on_demand.in_use_vcpus == 4
    assert on_demand.vcpus_per_node == 96
    assert on_demand.memory_gib_per_node == 1024
    # The demo fleet (also "kubernetes") has no nodes in this cluster: zero capacity.
    demo = NodePool.objects.get(slug="demo-us-west-a100-80gb-on-demand")
    assert demo.total_gpus == 0


def test_kubernetes_5xx_leaves_pools_untouched(catalog, kube_api):
    h100_node(kube_api, "h100-a")
    backend = KubernetesBackend(kube_api.api_client())
    capacity_sync(backend=backend)
    snapshot = {
        p.pk: (p.node_count, p.total_gpus, p.in_use_gpus, p.last_synced_at)
        for p in NodePool.objects.all()
    }

    h100_node(kube_api, "h100-b")
    kube_api.fail_next("GET", r"^/api/v1/nodes", status=503, times=None)
    try:
        with pytest.raises(BackendUnavailable):
            capacity_sync(backend=backend)
    finally:
        kube_api.clear_faults()

    assert {
        p.pk: (p.node_count, p.total_gpus, p.in_use_gpus, p.last_synced_at)
        for p in NodePool.objects.all()
    } == snapshot
    capacity_sync(backend=backend)
    assert pools("kubernetes")[("us-west", "h100-80gb", "on_demand")].total_gpus == 16


def test_kubernetes_vendors_and_tier_labels(catalog, kube_api):
    region = {"topology.kubernetes.io/region": "us-east"}
    kube_api.add_node(
        "mi300x-1",
        labels={"amd.com/gpu.product-name": "AMD_Instinct_MI300X", **region},
        allocatable={"amd.com/gpu": "8", "cpu": "192", "memory": "2Ti"},
    )
    kube_api.add_node(
        "ascend-1",
        labels={"accelerator": "huawei-Ascend910B", **region},
        allocatable={"huawei.com/Ascend910": "8", "cpu": "192", "memory": "1Ti"},
    )
    kube_api.add_node(
        "h100-tainted",
        labels={**H100_LABEL, **region},
        taints=[{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}],
    )
    kube_api.add_node(
        "h100-reserved", labels={**H100_LABEL, "gpugeek.io/tier": "reserved", **region}
    )
    kube_api.add_node("cpu-1", labels=region, allocatable={"cpu": "64", "memory": "256Gi"})

    capacity_sync(backend=KubernetesBackend(kube_api.api_client()))

    found = {k: p.total_gpus for k, p in pools("kubernetes").items() if p.node_count}
    assert found == {
        ("us-east", "mi300x", "on_demand"): 8,
        ("us-east", "ascend-910b", "on_demand"): 8,
        ("us-east", "h100-80gb", "spot"): 8,
        ("us-east", "h100-80gb", "reserved"): 8,
        ("us-east", None, "on_demand"): 0,
    }
    assert pools("kubernetes")[("us-east", None, "on_demand")].allocatable_vcpus == 64


def cpu_pod(name, node, cpu):
    resources = client.V1ResourceRequirements(requests={"cpu": cpu})
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[client.V1Container(name="main", image="busybox:1.36", resources=resources)],
        ),
    )


def test_kubernetes_millicore_requests_add_up(catalog, kube_api):
    kube_api.add_node(
        "cpu-1",
        labels={"topology.kubernetes.io/region": "us-east"},
        allocatable={"cpu": "8", "memory": "32Gi"},
    )
    core = client.CoreV1Api(kube_api.api_client())
    for n in range(4):
        core.create_namespaced_pod("default", cpu_pod(f"small-{n}", "cpu-1", "500m"))

    capacity_sync(backend=KubernetesBackend(kube_api.api_client()))

    assert pools("kubernetes")[("us-east", None, "on_demand")].in_use_vcpus == 2
