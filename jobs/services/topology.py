"""Topology-aware placement: a gang of more than TOPOLOGY_BLOCK_NODES nodes runs inside
one topology block of its pool (the nodes sharing the pool's `topology_label` value: a
zone, rack or NVLink/InfiniBand domain), as Kueue's topology-aware scheduling does, or
waits saying why. Admission and resume choose the block; the pods are then pinned to it
by a node selector (jobs.backends.kubernetes.manifests).

A block's free nodes are those capacity sync last saw idle there, less the nodes of
jobs placed in it since (admitted but not yet running then); jobs placed in one pass
count at once.
"""

from __future__ import annotations

from collections import defaultdict

from django.conf import settings
from django.db.models import Q, Sum

from jobs.models import Job, JobStatus
from marketplace.models import NodePool


def needs_block(job: Job) -> bool:
    """Only gangs over the threshold, all in one pool (a gang split over on-demand and
    spot pools spans two sets of nodes anyway)."""
    return job.nodes > settings.TOPOLOGY_BLOCK_NODES and not (
        job.on_demand_nodes and job.spot_nodes
    )


def _pool_of(job: Job) -> int | None:
    return job.pool_id if job.on_demand_nodes else job.spot_pool_id


def largest_block_refusal(pool: NodePool, nodes: int) -> str:
    """Why a gang of `nodes` can never run in `pool` as one block ("" when it can, or
    needs none): the launch refuses with it rather than queue forever."""
    if nodes <= settings.TOPOLOGY_BLOCK_NODES or not pool.topology_blocks:
        return ""
    largest = max(block["nodes"] for block in pool.topology_blocks.values())
    if nodes <= largest:
        return ""
    return (
        f"A job of more than {settings.TOPOLOGY_BLOCK_NODES} nodes runs inside one topology "
        f"block ({pool.topology_label}); the largest block of {pool.name} has {largest} nodes."
    )


class Blocks:
    """The free nodes per block of the pools one pass judges, read lazily per pool."""

    def __init__(self, pools: dict[int, NodePool]):
        self.pools = pools
        self._placed: dict[int, dict[str, int]] = {}

    def _placed_in(self, pool: NodePool) -> dict[str, int]:
        """Nodes per block of jobs placed there that capacity sync hadn't seen running."""
        if pool.pk not in self._placed:
            since_sync = ~Q(status=JobStatus.RUNNING)
            if pool.last_synced_at is not None:
                since_sync |= Q(running_since__gt=pool.last_synced_at)
            rows = (
                Job.objects.holding_compute()
                .filter(Q(pool_id=pool.pk) | Q(spot_pool_id=pool.pk))
                .exclude(topology_block="")
                .filter(since_sync)
                .order_by()
                .values_list("topology_block")
                .annotate(nodes=Sum("nodes"))
            )
            self._placed[pool.pk] = defaultdict(int, dict(rows))
        return self._placed[pool.pk]

    def place(self, job: Job) -> str:
        """Choose `job`'s block (the one with the fewest free nodes that still fits it:
        big blocks stay whole for bigger gangs) and record it on the job. Returns "" when
        placed or not needed, else why it must wait (WaitKind.TOPOLOGY)."""
        pool = self.pools.get(_pool_of(job) or 0)
        if not needs_block(job) or pool is None or not pool.topology_blocks:
            return ""
        placed = self._placed_in(pool)
        free = {
            block: counts["idle"] - placed[block]
            for block, counts in sorted(pool.topology_blocks.items())
        }
        fitting = [block for block, nodes in free.items() if nodes >= job.nodes]
        if not fitting:
            most = max(free, key=lambda block: free[block])
            return (
                f"needs {job.nodes} nodes inside one block of {pool.name} "
                f"({pool.topology_label}); the most free in one block is "
                f"{max(free[most], 0)} ({most})"
            )
        block = min(fitting, key=lambda b: (free[b], b))
        placed[block] += job.nodes
        job.topology_block = block
        Job.objects.filter(pk=job.pk).update(topology_block=block)
        return ""
