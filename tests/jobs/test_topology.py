"""Topology and heterogeneous pools: capacity sync reads interconnect, CPU architecture,
GPU memory and topology blocks from node labels; a gang of more than
TOPOLOGY_BLOCK_NODES nodes is admitted into one block (its pods pinned there) or waits
saying why; a node that stops answering (NotReady) is marked suspect. End to end on the
sandbox cluster through the official Kubernetes client."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.service_errors import ServiceError
from jobs.backends import get_backend
from jobs.backends.kubernetes.manifests.names import namespace_name
from jobs.backends.kubernetes.manifests.workload import job_manifests
from jobs.models import Job, JobStatus, WaitKind
from jobs.services.topology import largest_block_refusal
from marketplace.models import NodePool, SuspectNode
from marketplace.services import capacity_sync
from tests.jobs.test_sandbox import (
    ON_DEMAND,
    settle,
    spec,
    staff_client,  # noqa: F401  (a fixture)
    start_sandbox,
)
from tests.jobs_helpers import launch, submit

RACK = "topology.kubernetes.io/zone"


@pytest.fixture
def racks(db, settings, tmp_path):
    """The demo's us-west H100 on-demand pool as 12 sandbox nodes: racks of 8 and 4."""
    cluster = start_sandbox(settings, tmp_path, {ON_DEMAND: 12})
    yield cluster
    cluster.stop()
    assert cluster.server.errors == []


def nodes_of(cluster, job: Job) -> set[str]:
    return {
        pod["spec"].get("nodeName")
        for pod in cluster.server.list("pods", namespace=namespace_name(job.tenant_id))
        if pod["metadata"]["name"].startswith(f"gg-{job.pk}-a{job.attempt}-")
    }


def rack_of(cluster, node: str) -> str:
    return cluster.server.get("nodes", None, node)["metadata"]["labels"][RACK]


def test_sync_reads_the_pools_hardware_and_blocks_from_node_labels(racks):
    pool = NodePool.objects.get(slug=ON_DEMAND)
    assert pool.interconnects == ["infiniband", "nvlink", "rdma"]
    assert pool.cpu_arch == "amd64"
    assert pool.gpu_memory_gib == 80
    assert pool.topology_blocks == {
        "us-west-rack-0": {"nodes": 8, "idle": 8},
        "us-west-rack-1": {"nodes": 4, "idle": 4},
    }


def test_a_large_gang_runs_inside_one_block_and_the_next_waits_saying_why(racks, world):
    first = settle(launch(world, spec(name="gang-a", nodes=6)), JobStatus.RUNNING)
    assert first.topology_block == "us-west-rack-0"  # the only rack with 6 free nodes
    placed = nodes_of(racks, first)
    assert len(placed) == 6 and {rack_of(racks, node) for node in placed} == {"us-west-rack-0"}

    # 48 GPUs are free in the pool, but no rack has 6 free nodes (2 and 4).
    second = submit(world, "gang-b", **_gang(6))
    assert second.status == JobStatus.QUEUED
    assert second.wait_kind == WaitKind.TOPOLOGY
    assert "needs 6 nodes inside one block" in second.status_reason
    assert "the most free in one block is 4 (us-west-rack-1)" in second.status_reason

    # Once the first gang ends, its rack is free again and the second is admitted there.
    settle(first, JobStatus.SUCCEEDED, timeout=30)
    second.refresh_from_db()
    assert second.status != JobStatus.QUEUED, second.status_reason
    assert second.topology_block == "us-west-rack-0"


def test_a_gang_placed_in_a_block_carries_the_blocks_node_selector(racks, world):
    job = submit(world, "gang", **_gang(5))
    assert job.status == JobStatus.DISPATCHING and job.topology_block == "us-west-rack-0"
    [manifest] = job_manifests(job)
    assert manifest["spec"]["template"]["spec"]["nodeSelector"][RACK] == "us-west-rack-0"
    small = submit(world, "small", **_gang(4))
    assert small.topology_block == ""  # at the threshold: no block needed
    [manifest] = job_manifests(small)
    assert RACK not in manifest["spec"]["template"]["spec"]["nodeSelector"]


def test_a_gang_larger_than_every_block_is_refused_at_launch(racks, world):
    pool = NodePool.objects.get(slug=ON_DEMAND)
    assert largest_block_refusal(pool, 8) == ""
    assert largest_block_refusal(pool, 3) == ""
    with pytest.raises(ServiceError) as refused:
        submit(world, "too-big", **_gang(9))
    assert refused.value.field == "nodes"
    assert "runs inside one topology block" in refused.value.message
    assert "the largest block of H100 80GB SXM · us-west · on-demand has 8 nodes" in (
        refused.value.message
    )
    assert not Job.objects.filter(name="too-big").exists()


def test_a_node_that_stops_answering_is_marked_suspect_and_left_out(
    racks,
    world,
    staff_client,  # noqa: F811  (the fixture imported above)
):
    backend = get_backend("kubernetes")
    node = f"{ON_DEMAND}-3"
    staff_client.post(reverse("jobs:staff_sandbox_node_fail", args=[node]))
    capacity_sync(backend=backend)
    suspect = SuspectNode.objects.get(name=node)
    assert suspect.reason.startswith("NotReady at the capacity sync")
    pool = NodePool.objects.get(slug=ON_DEMAND)
    assert suspect.pool == pool
    assert pool.allocatable_gpus == 88
    assert pool.topology_blocks["us-west-rack-0"] == {"nodes": 7, "idle": 7}
    fleet = staff_client.get(reverse("jobs:staff_fleet")).content.decode()
    assert node in fleet and "NotReady" in fleet

    # Back up, it stays out until staff mark it healthy.
    staff_client.post(reverse("jobs:staff_sandbox_node_recover", args=[node]))
    capacity_sync(backend=backend)
    pool.refresh_from_db()
    assert pool.allocatable_gpus == 88
    SuspectNode.objects.filter(name=node).delete()
    capacity_sync(backend=backend)
    pool.refresh_from_db()
    assert pool.allocatable_gpus == 96


def _gang(nodes: int) -> dict:
    return {
        "image": "pytorch-2-5-cuda12-4",
        "gpu_type": "h100-80gb",
        "gpus_per_node": 8,
        "cpus": 16,
        "region": "us-west",
        "nodes": nodes,
    }
