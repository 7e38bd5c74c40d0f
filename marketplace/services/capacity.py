"""Capacity sync: refreshing each backend's node pools from its inventory.

Owns the grouping of nodes into pools (region × GPU type × tier, or the pool a node's
`gpugeek.io/pool` label names) and the matching of a node's GPU to a catalog GPU type;
the pools' capacity fields are written only here.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone
from django.utils.text import slugify

from marketplace.inventory import (
    ARCH_LABEL,
    InventorySource,
    NodeInventory,
    node_gpu_memory_gib,
    node_interconnects,
)
from marketplace.models import GpuType, NodePool, Region, SuspectNode

log = logging.getLogger(__name__)
# A node carrying this label belongs to the backend's pool of that slug (staff-made pools,
# the sandbox's demo pools) when its region, GPU type and tier agree with the pool.
POOL_LABEL = "gpugeek.io/pool"


def _match_gpu_type(node: NodeInventory, gpu_types: list[GpuType]) -> GpuType | None:
    if not node.gpu_product:
        return None
    for gpu_type in gpu_types:
        if node.labels.get(gpu_type.node_label_key) == gpu_type.node_label_value:
            return gpu_type
        # NVML says e.g. "NVIDIA L4" and "NVIDIA L40S": compare whole names, not substrings.
        reported = node.gpu_product.lower().removeprefix("nvidia ").strip()
        if reported in (name.lower() for name in gpu_type.nvml_names):
            return gpu_type
    return None


def _named_pool(
    node: NodeInventory, pools: dict[str, NodePool], region: Region, gpu_slug: str | None
) -> str:
    """The slug of the pool the node's label names, if that pool describes the node."""
    pool = pools.get(node.labels.get(POOL_LABEL, ""))
    if pool is None:
        return ""
    if (
        pool.region_id != region.pk
        or (pool.gpu_type.slug if pool.gpu_type else None) != gpu_slug
        or pool.tier != node.tier
    ):
        log.warning("node %s is labelled for pool %s but doesn't match it", node.name, pool.slug)
        return ""
    return pool.slug


@dataclass
class _PoolCapacity:
    nodes: int = 0
    gpus_per_node: int = 0
    total_gpus: int = 0
    allocatable_gpus: int = 0
    in_use_gpus: int = 0
    vcpus_per_node: int = 0
    memory_gib_per_node: int = 0
    allocatable_vcpus: int = 0
    in_use_vcpus: int = 0


def _hardware(nodes: list[NodeInventory]) -> dict:
    """What all of a pool's nodes have: interconnects in common, one CPU architecture
    ("" when mixed or unknown), the least GPU memory any reports (0: none says)."""
    interconnects = set.intersection(*(node_interconnects(n.labels) for n in nodes))
    arches = {n.labels.get(ARCH_LABEL, "") for n in nodes}
    memories = [m for n in nodes if (m := node_gpu_memory_gib(n.labels))]
    return {
        "interconnects": sorted(interconnects),
        "cpu_arch": arches.pop() if len(arches) == 1 else "",
        "gpu_memory_gib": min(memories, default=0),
    }


def _blocks(nodes: list[NodeInventory], label: str, usable) -> dict[str, dict[str, int]]:
    """Per topology block (the nodes sharing `label`'s value): its usable nodes and how
    many of them have no GPU in use. Nodes without the label belong to no block."""
    blocks: dict[str, dict[str, int]] = {}
    for node in nodes:
        block = node.labels.get(label)
        if not block or not usable(node):
            continue
        counts = blocks.setdefault(block, {"nodes": 0, "idle": 0})
        counts["nodes"] += 1
        counts["idle"] += node.gpus_in_use == 0
    return blocks


@transaction.atomic
def capacity_sync(*, backend: InventorySource, now: datetime | None = None) -> list[NodePool]:
    """Refresh the backend's pools from its inventory.

    Nodes group into pools by region × GPU type × tier; a pool is created the first time
    its kind of node appears, and drops to zero capacity when its nodes are gone.
    Raises BackendUnavailable (before writing anything) when the backend can't be reached.
    """
    now = now or timezone.now()
    nodes = backend.inventory()
    gpu_types = list(GpuType.objects.filter(is_active=True))
    suspect = set(SuspectNode.objects.values_list("name", flat=True))
    regions = {region.slug: region for region in Region.objects.all()}
    named_pools = {
        pool.slug: pool
        for pool in NodePool.objects.filter(backend=backend.name).select_related("gpu_type")
    }
    not_ready = {node.name for node in nodes if not node.ready and node.name not in suspect}
    suspect |= not_ready

    def usable(node: NodeInventory) -> bool:
        return node.schedulable and node.name not in suspect

    grouped: dict[tuple[str, str | None, str, str], _PoolCapacity] = defaultdict(_PoolCapacity)
    members: dict[tuple[str, str | None, str, str], list[NodeInventory]] = defaultdict(list)
    for node in nodes:
        region = regions.get(node.region)
        if region is None:
            log.warning("node %s is in unknown region %r; skipped", node.name, node.region)
            continue
        gpu_type = _match_gpu_type(node, gpu_types)
        if node.gpu_product and gpu_type is None:
            log.warning("node %s has unknown GPU %r; skipped", node.name, node.gpu_product)
            continue
        gpu_slug = gpu_type.slug if gpu_type else None
        key = (region.slug, gpu_slug, node.tier, _named_pool(node, named_pools, region, gpu_slug))
        members[key].append(node)
        capacity = grouped[key]
        capacity.nodes += 1
        capacity.gpus_per_node = max(capacity.gpus_per_node, node.gpus_allocatable)
        capacity.total_gpus += node.gpus_allocatable
        if usable(node):
            capacity.allocatable_gpus += node.gpus_allocatable
            capacity.allocatable_vcpus += node.vcpus_allocatable
        capacity.in_use_gpus += node.gpus_in_use
        capacity.in_use_vcpus += node.vcpus_in_use
        capacity.vcpus_per_node = max(capacity.vcpus_per_node, node.vcpus_allocatable)
        capacity.memory_gib_per_node = max(capacity.memory_gib_per_node, node.memory_gib)

    gpu_by_slug = {gpu_type.slug: gpu_type for gpu_type in gpu_types}
    seen: list[NodePool] = []
    for key, capacity in grouped.items():
        region_slug, gpu_slug, tier, named = key
        slug = named or slugify(f"{backend.name}-{region_slug}-{gpu_slug or 'cpu'}-{tier}")
        slug = slug.replace("_", "-")
        pool, _ = NodePool.objects.select_for_update().get_or_create(
            slug=slug,
            defaults={
                "name": f"{gpu_by_slug[gpu_slug].model if gpu_slug else 'CPU'} · "
                f"{region_slug} · {tier.replace('_', '-')}",
                "region": regions[region_slug],
                "backend": backend.name,
                "tier": tier,
                "gpu_type": gpu_by_slug.get(gpu_slug) if gpu_slug else None,
            },
        )
        for name, value in vars(capacity).items():
            setattr(pool, "node_count" if name == "nodes" else name, value)
        for name, value in _hardware(members[key]).items():
            setattr(pool, name, value)
        pool.topology_blocks = _blocks(members[key], pool.topology_label, usable)
        pool.on_console_host = backend.runs_on_console_host
        pool.simulated = backend.simulated
        pool.last_synced_at = now
        pool.save()
        seen.append(pool)
        # A node that stopped answering is suspect like one with a hardware fault: staff
        # see it, capacity leaves it out until they mark it healthy (its pods are
        # disrupted and requeued by the backend's own path, away from it).
        for node in members[key]:
            if node.name in not_ready:
                reason = f"NotReady at the capacity sync of {now:%Y-%m-%d %H:%M} UTC"
                SuspectNode.objects.get_or_create(
                    name=node.name, defaults={"pool": pool, "reason": reason}
                )
    # Pools whose nodes disappeared keep their row (jobs refer to them) but no capacity.
    NodePool.objects.filter(backend=backend.name).exclude(pk__in=[p.pk for p in seen]).update(
        node_count=0,
        total_gpus=0,
        allocatable_gpus=0,
        in_use_gpus=0,
        allocatable_vcpus=0,
        in_use_vcpus=0,
        topology_blocks={},
        last_synced_at=now,
    )
    return seen


@transaction.atomic
def node_mark_suspect(*, name: str, pool: NodePool | None, reason: str) -> SuspectNode | None:
    """Mark node `name` suspect; its pool's allocatable capacity loses one node's share at
    once (capacity sync leaves it out from then on). None when it already was."""
    node, created = SuspectNode.objects.get_or_create(
        name=name, defaults={"pool": pool, "reason": reason[:2000]}
    )
    if not created:
        return None
    if pool is not None:
        NodePool.objects.filter(pk=pool.pk).update(
            allocatable_gpus=Greatest(F("allocatable_gpus") - F("gpus_per_node"), 0),
            allocatable_vcpus=Greatest(F("allocatable_vcpus") - F("vcpus_per_node"), 0),
        )
    return node


def node_clear_suspect(*, node: SuspectNode) -> None:
    """Staff found the node healthy: it counts again from the next capacity sync."""
    SuspectNode.objects.filter(pk=node.pk).delete()
