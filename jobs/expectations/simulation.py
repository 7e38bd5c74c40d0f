"""When queued jobs will start: a small simulation of the queue, pure (no database).

The model, as admission behaves (jobs.services.admission):
- Each resource (a pool's GPUs or vCPUs, a tenant's quota) has a capacity. What the jobs
  holding compute now take of it is freed at their expected end (their start of running
  plus their predicted runtime, never earlier than now).
- Queued jobs are placed in queue order (priority, then first come, first served). A job
  starts at the first moment when, for its whole predicted runtime, every resource it
  needs has room; it then holds that room until its expected end.
- No overtaking in a pool: a job starts no earlier than the jobs ahead of it for the same
  pool would fit their pools. A job held by its tenant's quota holds back only that
  tenant's later jobs (of its pools), as in admission.
- A job that can never fit (more than a resource's capacity, an inactive pool) gets no
  start, and neither do the jobs behind it in its pools.
Times are seconds from now, so the function is easy to test and replay.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# ("pool", id), ("quota_jobs", id), ("quota_gpus", id): what a job takes room in.
Resource = tuple[str, int]
NEVER = math.inf


@dataclass(frozen=True)
class Holder:
    """A job holding compute now: what it holds and when it is expected to end."""

    needs: Mapping[Resource, int]
    ends_in: float


@dataclass(frozen=True)
class Waiter:
    """A queued job, given in queue order. `pool_needs` are shared with everyone (and
    ordered: no overtaking); `quota_needs` are its tenant's; `own_order` names what only
    its tenant's later jobs queue behind (its (tenant, pool) pairs)."""

    job_id: int
    pool_needs: Mapping[Resource, int]
    runtime: float
    quota_needs: Mapping[Resource, int] = field(default_factory=dict)
    own_order: frozenset[tuple[int, int]] = frozenset()


class _Profile:
    """A resource's use over time as a step function: `usage[i]` on [times[i], times[i+1])."""

    def __init__(self, in_use: int) -> None:
        self.times: list[float] = [0.0]
        self.usage: list[int] = [in_use]

    def _split(self, at: float) -> int:
        i = bisect.bisect_right(self.times, at) - 1
        if self.times[i] != at:
            self.times.insert(i + 1, at)
            self.usage.insert(i + 1, self.usage[i])
            i += 1
        return i

    def add(self, amount: int, start: float, end: float) -> None:
        if end <= start:
            return
        first = self._split(start)
        last = len(self.times) if end == NEVER else self._split(end)
        for i in range(first, last):
            self.usage[i] += amount

    def blocked_until(self, start: float, end: float, room: int) -> float | None:
        """Where the last step over `room` in [start, end) ends (NEVER if it never
        does), or None when the whole span has room: no start before that end can fit,
        so the search jumps there instead of trying each change point in between."""
        i = bisect.bisect_right(self.times, start) - 1
        last = bisect.bisect_left(self.times, end, lo=i + 1)
        for j in range(last - 1, i - 1, -1):
            if self.usage[j] > room:
                return self.times[j + 1] if j + 1 < len(self.times) else NEVER
        return None


def _earliest_fit(
    needs: Mapping[Resource, int],
    profiles: Mapping[Resource, _Profile],
    capacity: Mapping[Resource, int],
    not_before: float,
    runtime: float,
) -> float:
    """The first time ≥ not_before at which `needs` fit for `runtime` seconds."""
    if not_before == NEVER:
        return NEVER
    if any(amount > capacity.get(resource, 0) for resource, amount in needs.items() if amount):
        return NEVER
    start = not_before
    while True:
        end = max(start + max(runtime, 0.0), start + 1e-9)
        blocked = [
            until
            for resource, amount in needs.items()
            if amount
            and (until := profiles[resource].blocked_until(start, end, capacity[resource] - amount))
            is not None
        ]
        if not blocked:
            return start
        start = max(blocked)
        if start == NEVER:
            return NEVER


def simulate_starts(
    *,
    capacity: Mapping[Resource, int],
    holders: Iterable[Holder],
    queue: Sequence[Waiter],
    wanted: Iterable[int] | None = None,
) -> dict[int, float | None]:
    """Each queued job's expected start, in seconds from now (None: not foreseeable).
    `queue` is in queue order; placing stops after the last job of `wanted` (None: all)."""
    profiles: dict[Resource, _Profile] = {}

    def profile(resource: Resource) -> _Profile:
        if resource not in profiles:
            profiles[resource] = _Profile(0)
        return profiles[resource]

    for holder in holders:
        for resource, amount in holder.needs.items():
            # Held from now until its expected end (an overdue job: a moment from now).
            profile(resource).add(amount, 0.0, max(holder.ends_in, 0.0))
    remaining = None if wanted is None else set(wanted)
    pool_front: dict[Resource, float] = {}
    own_front: dict[tuple[int, int], float] = {}
    starts: dict[int, float | None] = {}
    for waiter in queue:
        if remaining is not None and not remaining:
            break
        for resource in (*waiter.pool_needs, *waiter.quota_needs):
            profile(resource)
        # Where the pools alone would take it (what later jobs of any tenant queue
        # behind), then when its tenant's quota and earlier jobs let it start.
        in_pool_order = max([0.0] + [pool_front.get(r, 0.0) for r in waiter.pool_needs])
        pools_fit = _earliest_fit(
            waiter.pool_needs, profiles, capacity, in_pool_order, waiter.runtime
        )
        in_own_order = max([pools_fit] + [own_front.get(key, 0.0) for key in waiter.own_order])
        needs = {**waiter.pool_needs, **waiter.quota_needs}
        start = _earliest_fit(needs, profiles, capacity, in_own_order, waiter.runtime)
        for resource in waiter.pool_needs:
            pool_front[resource] = max(pool_front.get(resource, 0.0), pools_fit)
        for key in waiter.own_order:
            own_front[key] = max(own_front.get(key, 0.0), start)
        if start != NEVER:
            for resource, amount in needs.items():
                profiles[resource].add(amount, start, start + waiter.runtime)
        starts[waiter.job_id] = None if start == NEVER else start
        if remaining is not None:
            remaining.discard(waiter.job_id)
    return starts
