"""Heterogeneous pools: capacity sync reads what node labels say (interconnect, CPU
architecture, GPU memory, topology blocks); a node that is not Ready is suspect; offers
show and filter by the hardware; staff set locality weight and topology label."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from django.urls import reverse

from console.models import AuditEvent
from marketplace.models import NodePool, SuspectNode
from marketplace.selectors import offers
from marketplace.services import capacity_sync
from tests.conftest import signed_in_client, token_client
from tests.marketplace.test_capacity import H100_LABEL, FakeBackend, h100, pools

ZONE = "topology.kubernetes.io/zone"


def labelled(name: str, zone: str, *, in_use: int = 0, **labels: str):
    node = h100(name, in_use=in_use)
    return replace(
        node, labels={**node.labels, ZONE: zone, "kubernetes.io/arch": "amd64", **labels}
    )


def test_the_pool_has_what_all_its_nodes_have(catalog):
    backend = FakeBackend(
        nodes=[
            labelled(
                "a", "z1", nvlink="true", network="infiniband", **{"nvidia.com/gpu.memory": "81559"}
            ),
            labelled(
                "b", "z1", nvlink="true", network="rdma", **{"nvidia.com/gpu.memory": "81920"}
            ),
            labelled("c", "z2", in_use=8, nvlink="true", network="rdma"),
            labelled("d", "z2", **{"nvidia.com/gpu.nvlink": "18"}),
        ]
    )
    capacity_sync(backend=backend)
    pool = pools("fake")[("us-west", "h100-80gb", "on_demand")]
    assert pool.interconnects == ["nvlink"]  # d has no RDMA network
    assert pool.cpu_arch == "amd64"
    assert pool.gpu_memory_gib == 80  # 81,559 MiB rounded; the least any reports
    assert pool.topology_blocks == {"z1": {"nodes": 2, "idle": 2}, "z2": {"nodes": 2, "idle": 1}}

    backend.nodes = [labelled("a", "z1"), replace(labelled("e", "z1"), labels=H100_LABEL)]
    capacity_sync(backend=backend)
    pool.refresh_from_db()
    assert pool.interconnects == [] and pool.cpu_arch == ""  # one node says no architecture
    assert pool.gpu_memory_gib == 0  # none says: the GPU type's 80 GiB counts
    assert pool.memory_per_gpu_gib == 80
    assert pool.topology_blocks == {"z1": {"nodes": 1, "idle": 1}}  # e has no block label


def test_a_node_that_is_not_ready_is_suspect_and_left_out(catalog):
    backend = FakeBackend(nodes=[labelled("a", "z1"), replace(labelled("b", "z1"), ready=False)])
    capacity_sync(backend=backend)
    pool = pools("fake")[("us-west", "h100-80gb", "on_demand")]
    assert pool.allocatable_gpus == 8 and pool.total_gpus == 16
    assert pool.topology_blocks == {"z1": {"nodes": 1, "idle": 1}}
    suspect = SuspectNode.objects.get(name="b")
    assert suspect.pool == pool and "NotReady" in suspect.reason
    # Ready again: staff decide when it counts (it stays suspect until marked healthy).
    backend.nodes = [labelled("a", "z1"), labelled("b", "z1")]
    capacity_sync(backend=backend)
    pool.refresh_from_db()
    assert pool.allocatable_gpus == 8
    assert SuspectNode.objects.filter(name="b").count() == 1


def test_offers_show_and_filter_by_interconnect_and_architecture(catalog, world):
    NodePool.objects.filter(slug="demo-us-west-h100-80gb-on-demand").update(
        interconnects=["infiniband", "nvlink", "rdma"], cpu_arch="amd64"
    )
    NodePool.objects.filter(slug="demo-eu-central-ascend-910b-on-demand").update(cpu_arch="arm64")
    rdma = offers(tenant=world.tenant, interconnect="rdma")
    assert rdma and all("rdma" in offer.interconnects for offer in rdma)
    assert ("h100-80gb", "us-west", "on_demand") in {
        (o.gpu_label, o.region.slug, o.tier) for o in rdma
    }
    arm = offers(tenant=world.tenant, cpu_arch="arm64")
    assert {offer.gpu_label for offer in arm} == {"ascend-910b"}

    client = signed_in_client(world.member, world.tenant)
    page = client.get(reverse("marketplace:offers"), {"interconnect": "infiniband"})
    assert page.status_code == 200
    assert 'data-testid="interconnect"' in page.content.decode()
    api = token_client(world.member, world.tenant)
    rows = api.get("/api/v1/offers", {"cpu_arch": "arm64", "page_size": 100}).json()["results"]
    assert {row["gpu_type"] for row in rows} == {"ascend-910b"}
    assert all(row["cpu_arch"] == "arm64" for row in rows)
    bad = api.get("/api/v1/offers", {"interconnect": "smoke-signals"})
    assert bad.status_code == 400 and "interconnect" in bad.content.decode()


def test_staff_set_locality_weight_and_topology_label(catalog, staff_user, world):
    api = token_client(staff_user, world.tenant)
    pool = NodePool.objects.filter(gpu_type__isnull=False).first()
    url = f"/api/v1/staff/pools/{pool.pk}"
    assert api.patch(url, {"locality_weight": "0.5"}, format="json").status_code == 400
    refused = api.patch(url, {"topology_label": "not a label!"}, format="json")
    assert refused.status_code == 400 and "topology_label" in refused.content.decode()
    saved = api.patch(
        url, {"locality_weight": "2", "topology_label": "example.com/rack"}, format="json"
    )
    assert saved.status_code == 200, saved.content
    assert saved.json()["locality_weight"] == "2.00"
    pool.refresh_from_db()
    assert (pool.locality_weight, pool.topology_label) == (Decimal(2), "example.com/rack")
    assert AuditEvent.objects.filter(action="node_pool.changed").exists()

    page = signed_in_client(staff_user, world.tenant).get(
        reverse("marketplace:staff_pool_edit", args=[pool.pk])
    )
    assert "Weight of data locality against price" in page.content.decode()
