"""Preemption: which running jobs a queued job that can't fit may stop, and stopping them.

The choice (`choose_victims`) is a pure function, so it can be checked against brute
force; admission (`jobs.services.admission.jobs_admit`) calls `preemption_plan` for a job
blocked by capacity and `jobs_preempt` to carry a plan out.

Rules (per pool the preemptor needs room in):
- only while the pool's utilisation is at least its `preemption_threshold`;
- victims have a strictly lower priority than the preemptor, so a victim can never
  preempt its preemptor back (priorities are a strict order: no loops);
- the preemptor's own organisation's jobs first; other organisations' jobs only where
  staff allow it on the pool (`preempt_other_tenants_spot`), and only jobs running
  entirely on spot capacity in that pool: never another organisation's on-demand work;
- never more than needed: the victims free enough with the least sum of priority
  weight × units lost; among equal costs, the set whose oldest victim started last
  (then the next oldest…) is taken, so the least work is lost.

A victim goes through the spot-reclaim path of the state machine: `preempted` (its
timeline names the preemptor and why), then `queued` as a new attempt, which resumes from
its latest checkpoint (GPUGEEK_RESUMED=1); its old attempt is stopped with notice
(SIGTERM and the grace period to checkpoint) by a task after commit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Q

from console.queueing import enqueue_on_commit
from jobs import tasks
from jobs.actors import PREEMPTION, SYSTEM
from jobs.backends import get_backend
from jobs.models import PRIORITY_RANK, PRIORITY_WEIGHT, Job, JobStatus, WaitKind
from jobs.services.dispatch import transition_quietly
from jobs.state import job_note, job_transition
from marketplace.models import NodePool

# What a preemption (or a spot reclaim) stops: work on the backend that isn't already
# stopping. `dispatching` jobs aren't started yet and can't be told to stop.
PREEMPTIBLE = frozenset({JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.RESUMING})
REQUEUED_REASON = "requeued as a new attempt from the checkpoint"


@dataclass(frozen=True)
class Candidate:
    """A job that may be stopped: `units` of the pool it frees (GPUs, or vCPUs in a CPU
    pool), its priority `weight`, when its current run `started` (for ties) and whether
    it belongs to the preemptor's own organisation (taken first)."""

    key: int
    units: int
    weight: int
    started: datetime
    own: bool

    @property
    def cost(self) -> int:
        return self.weight * self.units


def choose_victims(need: int, candidates: Sequence[Candidate]) -> list[Candidate] | None:
    """The victims that free at least `need` units at the least cost, own-organisation
    candidates alone when they can, else from all candidates; None when even all of
    them can't free enough. Ties (equal cost) go to the set whose oldest victim is the
    newest, then the next oldest, and so on. Exact: a 0/1 knapsack over freed units
    capped at `need` (units × candidates steps)."""
    if need <= 0:
        return []
    own = [c for c in candidates if c.own]
    if sum(c.units for c in own) >= need:
        return _cheapest_cover(need, own)
    if sum(c.units for c in candidates) >= need:
        return _cheapest_cover(need, list(candidates))
    return None


def _cheapest_cover(need: int, candidates: list[Candidate]) -> list[Candidate] | None:
    # The tie-break as an additive term: candidate of age rank r (0 = newest) adds 2**r,
    # so comparing sums compares sets by their oldest differing member, exactly the
    # "oldest victim newest" order; (cost, bits) is then minimised lexicographically,
    # which a knapsack keeps exact because both terms add up.
    by_age = sorted(candidates, key=lambda c: (c.started, c.key), reverse=True)
    bit = {c.key: 1 << rank for rank, c in enumerate(by_age)}
    best: dict[int, tuple[int, int, tuple[Candidate, ...]]] = {0: (0, 0, ())}
    for candidate in candidates:
        if candidate.units <= 0:
            continue
        for freed, (cost, bits, chosen) in list(best.items()):
            reached = min(need, freed + candidate.units)
            option = (cost + candidate.cost, bits + bit[candidate.key], (*chosen, candidate))
            if reached not in best or option[:2] < best[reached][:2]:
                best[reached] = option
    if need not in best:
        return None
    return sorted(best[need][2], key=lambda c: c.key)


@dataclass(frozen=True)
class Victim:
    """A job a plan stops, with what it frees in each pool."""

    job: Job
    freed: dict[int, int]


def _units(job: Job, pool: NodePool) -> int:
    """What `job` holds in `pool` (GPUs, or vCPUs in a CPU pool)."""
    per_node = job.gpus_per_node if pool.gpu_type_id else job.cpus
    nodes = (job.on_demand_nodes if job.pool_id == pool.pk else 0) + (
        job.spot_nodes if job.spot_pool_id == pool.pk else 0
    )
    return nodes * per_node


def _allowed_in(pool: NodePool, held: int) -> bool:
    """Preemption may happen in `pool` at this utilisation (`held` of its capacity)."""
    capacity = pool.allocatable_gpus if pool.gpu_type_id else pool.allocatable_vcpus
    return capacity > 0 and Decimal(held) >= pool.preemption_threshold * capacity


def preemption_plan(
    job: Job, pools: dict[int, NodePool], deficits: dict[int, int], held: dict[int, int]
) -> list[Victim] | None:
    """The victims that make room for `job`: `deficits` are the units it lacks per pool,
    `held` what running jobs hold there now. None when preemption can't make room in
    every pool it lacks (all or nothing: a gang is never half made room for)."""
    lower = [p for p, rank in PRIORITY_RANK.items() if rank > PRIORITY_RANK[job.priority]]
    if not lower or any(
        pid not in pools or not _allowed_in(pools[pid], held[pid]) for pid in deficits
    ):
        return None
    victims: dict[int, Victim] = {}
    remaining = dict(deficits)
    for pool_id in sorted(deficits):
        pool = pools[pool_id]
        if remaining[pool_id] <= 0:
            continue
        rows = (
            Job.objects.filter(status__in=PREEMPTIBLE, priority__in=lower)
            .filter(Q(pool_id=pool_id) | Q(spot_pool_id=pool_id))
            .exclude(pk__in=list(victims))
        )
        if not pool.preempt_other_tenants_spot:
            rows = rows.filter(tenant_id=job.tenant_id)
        else:  # others' jobs only when all of their compute is spot here
            rows = rows.filter(
                Q(tenant_id=job.tenant_id) | Q(on_demand_nodes=0, spot_pool_id=pool_id)
            )
        # Locked (after admission's pool and quota locks): a victim can't end or be
        # paused meanwhile, so what it frees is what it held.
        by_pk = {row.pk: row for row in rows.select_for_update().order_by("pk")}
        candidates = [
            Candidate(
                key=row.pk,
                units=_units(row, pool),
                weight=PRIORITY_WEIGHT[row.priority],
                started=row.running_since or row.status_changed_at,
                own=row.tenant_id == job.tenant_id,
            )
            for row in by_pk.values()
        ]
        chosen = choose_victims(remaining[pool_id], candidates)
        if chosen is None:
            return None
        for candidate in chosen:
            row = by_pk[candidate.key]
            freed = {pid: _units(row, pools[pid]) for pid in _job_pools(row) if pid in pools}
            victims[row.pk] = Victim(row, freed)
            for pid, units in freed.items():
                if pid in remaining:
                    remaining[pid] -= units
    return list(victims.values())


def _job_pools(job: Job) -> list[int]:
    return [pid for pid in (job.pool_id, job.spot_pool_id) if pid]


def _reason(victim: Job, preemptor: Job, pools: Collection[NodePool]) -> str:
    where = ", ".join(pool.name for pool in pools)
    if victim.tenant_id == preemptor.tenant_id:
        return (
            f"preempted by job #{preemptor.pk} {preemptor.name} ({preemptor.priority} "
            f"priority, this one {victim.priority}) to make room in {where}"
        )
    # Another organisation's job is not named to this one.
    return (
        f"preempted by a {preemptor.priority}-priority job of another organisation: "
        f"staff allow reclaiming spot capacity in {where}"
    )


def jobs_preempt(*, preemptor: Job, victims: list[Victim], pools: dict[int, NodePool]) -> None:
    """Stop `victims` for `preemptor` (inside admission's transaction): each becomes
    `preempted` (its timeline naming who and why), then `queued` as its next attempt;
    its old attempt is stopped with notice after commit. The preemptor's timeline lists
    them."""
    for victim in victims:
        job = victim.job
        where = [pools[pid] for pid in victim.freed if victim.freed[pid]]
        job_transition(
            job=job,
            to=JobStatus.PREEMPTED,
            actor=PREEMPTION,
            reason=_reason(job, preemptor, where),
            expected_from=PREEMPTIBLE,
        )
        enqueue_on_commit(tasks.job_preempted_stop_task, job.pk, job.attempt)
        job_requeue_preempted(job=job)
    own = [f"#{v.job.pk}" for v in victims if v.job.tenant_id == preemptor.tenant_id]
    others = len(victims) - len(own)
    named = ", ".join(own + ([f"{others} of other organisations (spot)"] if others else []))
    job_note(
        job=preemptor,
        actor=PREEMPTION,
        reason=f"admitted by preempting {len(victims)} lower-priority job(s): {named}",
    )


def job_requeue_preempted(*, job: Job) -> Job:
    """A preempted job (by a spot reclaim or by admission) queues again as its next
    attempt, which resumes from its latest checkpoint."""
    return transition_quietly(
        job,
        JobStatus.QUEUED,
        SYSTEM,
        REQUEUED_REASON,
        attempt=job.attempt + 1,
        assigned_devices=[],
        wait_kind=WaitKind.ADMISSION,
    )


def job_preempted_stop(*, job: Job, attempt: int) -> None:
    """Stop attempt `attempt` of a preempted job on its backend with notice, as a pause
    does (SIGTERM, then the grace period; Kubernetes deletes its pods and keeps the Job,
    which the next attempt's submit removes). Acts only while the next attempt is not
    started yet (queued or being dispatched), so a late rerun never stops it."""
    if job.attempt != attempt + 1 or job.status not in (JobStatus.QUEUED, JobStatus.DISPATCHING):
        return
    old = Job.objects.get(pk=job.pk)
    old.attempt = attempt  # the backend finds an attempt's objects by the row's attempt
    get_backend(job.backend).suspend(old)
