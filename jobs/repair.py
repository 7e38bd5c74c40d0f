"""Self-repair of hardware faults: a job whose GPUs report an XID error or uncorrectable
ECC errors (DCGM's `DCGM_FI_DEV_XID_ERRORS`, `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`, read with
the GPU metrics), or one of whose ranks is stuck
while the others run (its GPUs idle for STUCK_WINDOW), is asked to checkpoint and stop
(SIGTERM and the grace period, as a preemption), the node is marked suspect (capacity
leaves it out, pods avoid it, it is cordoned where the console may), and the job queues
again as its next attempt, which resumes from its latest checkpoint elsewhere. Each step
goes through the state machine and the timeline names the rule and the readings. A job
whose hardware repair is off (its own choice or its organisation's default) is alerted
and its node marked suspect, but it keeps running.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from datetime import datetime, timedelta

from django.db import transaction
from django.http import HttpRequest

from console.models import User
from console.queueing import enqueue_on_commit
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from jobs import tasks
from jobs.actors import ALERTS
from jobs.alerts import alert_raise, self_repair_choices
from jobs.backends.base import GpuReading
from jobs.models import AlertKind, Job, JobAlert, JobMetricSample, JobMonitor, JobStatus
from jobs.notifications import job_repair_notify
from jobs.services.admission import job_pools, jobs_admit
from jobs.services.preemption import PREEMPTIBLE, job_requeue_preempted
from jobs.state import IllegalTransition, job_transition
from marketplace.models import NodePool, SuspectNode
from marketplace.services import node_clear_suspect, node_mark_suspect

RULE = "hardware fault (XID error)"
ECC_RULE = "hardware fault (double-bit ECC errors)"
# A rank is stuck when its GPUs stay under STUCK_UTILIZATION % for STUCK_WINDOW while
# the job's other ranks average over BUSY_UTILIZATION %: a hung GPU or interconnect.
STUCK_WINDOW = timedelta(minutes=5)
STUCK_UTILIZATION = 5.0
BUSY_UTILIZATION = 50.0


def _rank_pool(job: Job, node: str) -> NodePool | None:
    """The pool of the rank a reading names ("rank 3"): on-demand ranks come first."""
    with contextlib.suppress(ValueError):
        rank = int(node.removeprefix("rank "))
        return job.pool if rank < job.on_demand_nodes else job.spot_pool
    return job.pool


def job_hardware_fault(*, job: Job, faulty: list[GpuReading], now: datetime) -> JobAlert | None:
    """Repair `job` (running) whose `faulty` readings carry XID or double-bit ECC errors;
    None when the same fault was already acted on within the alert cool-down."""
    evidence = "; ".join(
        f"{reading.host or reading.node} GPU {reading.gpu}: {reading.fault}" for reading in faulty
    )
    hosts = {reading.host: _rank_pool(job, reading.node) for reading in faulty if reading.host}
    rule = RULE if any(reading.xid for reading in faulty) else ECC_RULE
    return _repair(job, AlertKind.HARDWARE_FAULT, rule, evidence, hosts, now)


def stuck_ranks(
    samples: list[JobMetricSample], now: datetime, *, window: timedelta = STUCK_WINDOW
) -> dict[str, tuple[float, float]]:
    """Ranks whose GPUs all stayed under STUCK_UTILIZATION % over `window` while every
    other rank averaged over BUSY_UTILIZATION %: {rank: (its highest, the others' mean)}.
    Needs readings of at least two ranks covering the whole window."""
    start = now - window
    by_rank: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
    for sample in samples:
        if sample.utilization is not None and start - window <= sample.at <= now:
            by_rank[sample.node].append((sample.at, sample.utilization))
    if len(by_rank) < 2 or any(min(at for at, _ in s) > start for s in by_rank.values()):
        return {}
    recent = {rank: [v for at, v in s if at >= start] for rank, s in by_rank.items()}
    stuck = {}
    for rank, values in recent.items():
        others = [v for other, vs in recent.items() if other != rank for v in vs]
        if values and others and max(values) < STUCK_UTILIZATION:
            busy = sum(others) / len(others)
            if busy > BUSY_UTILIZATION:
                stuck[rank] = (max(values), busy)
    return stuck if len(stuck) < len(recent) else {}


def job_stuck_rank(
    *, job: Job, readings: list[GpuReading], samples: list[JobMetricSample], now: datetime
) -> JobAlert | None:
    """Repair a multi-node `job` one of whose ranks is stuck (`stuck_ranks` over its
    recent `samples`); the rank's node (from the current `readings`) is marked suspect."""
    stuck = stuck_ranks(samples, now)
    if not stuck:
        return None
    host_of = {reading.node: reading.host for reading in readings if reading.host}
    minutes = int(STUCK_WINDOW.total_seconds() // 60)
    evidence = "; ".join(
        f"{rank} on {host_of.get(rank, 'its node')}: GPU utilisation at most {highest:.0f} % "
        f"for {minutes} min while the other ranks averaged {busy:.0f} %"
        for rank, (highest, busy) in sorted(stuck.items())
    )
    hosts = {host_of[rank]: _rank_pool(job, rank) for rank in stuck if rank in host_of}
    rule = "a rank stuck while the others run"
    return _repair(job, AlertKind.STUCK_RANK, rule, evidence, hosts, now)


def _repair(
    job: Job,
    kind: str,
    rule: str,
    evidence: str,
    hosts: dict[str, NodePool | None],
    now: datetime,
) -> JobAlert | None:
    """Alert; mark `hosts` suspect; checkpoint and requeue the job away from them unless
    its self-repair choice (or its organisation's default) says to leave it running."""
    away = ", ".join(sorted(hosts)) or "the node"
    monitor = JobMonitor.objects.filter(job=job).first()
    move = self_repair_choices(job=job, monitor=monitor).hardware_repair
    action = (
        f"Checkpointing the job and resuming it away from {away}."
        if move
        else f"Hardware repair is off for this job: it keeps running on {away}, which is "
        "marked suspect."
    )
    alert = alert_raise(
        job=job,
        kind=kind,
        severity="critical",
        # What is done first: a long list of readings is what the alert's length cuts.
        message=f"{AlertKind(kind).label}. {action} Readings: {evidence}.",
        now=now,
    )
    if alert is None:
        return None
    with transaction.atomic():
        reason = f"{evidence} (job #{job.pk})"
        marked = [
            node
            for host, pool in sorted(hosts.items())
            if (node := node_mark_suspect(name=host, pool=pool, reason=reason)) is not None
        ]
        if move:
            _move_off(job, rule, evidence, away)
        else:
            job_repair_notify(
                job, "runs on a faulty node", f"{evidence}; hardware repair is off for it"
            )
        # A cordon keeps new pods off the node and evicts none: a job left there runs on.
        for node in marked:
            enqueue_on_commit(tasks.node_cordon_task, job.backend, node.name)
    return alert


def _move_off(job: Job, rule: str, evidence: str, away: str) -> None:
    """Preempt the job (checkpoint, SIGTERM grace) and requeue its next attempt."""
    try:
        stopped = job_transition(
            job=job,
            to=JobStatus.PREEMPTED,
            actor=ALERTS,
            reason=f"self-repair, {rule}: {evidence}; {away} marked suspect; the job "
            "checkpoints and resumes on another node from its latest checkpoint",
            expected_from=PREEMPTIBLE,
        )
    except IllegalTransition:  # paused, cancelled or ended meanwhile: nothing to move
        return
    enqueue_on_commit(tasks.job_preempted_stop_task, stopped.pk, stopped.attempt)
    job_requeue_preempted(job=stopped)
    jobs_admit(pools=job_pools(stopped))
    job_repair_notify(stopped, "was moved off a faulty node", f"{evidence}; it resumes elsewhere")


def node_healthy(*, node: SuspectNode, user: User, request: HttpRequest | None = None) -> None:
    """Staff found a suspect node healthy: it counts again from the next capacity sync,
    pods may land on it, and it is uncordoned where the console cordoned it."""
    if not user.is_staff:
        raise ServiceError("Only platform staff can change this.", code=ErrorCode.FORBIDDEN)
    with transaction.atomic():
        node_clear_suspect(node=node)
        audit_record(
            action="node.marked_healthy",
            actor=user,
            request=request,
            metadata={"node": node.name, "reason": node.reason, "cordoned": node.cordoned},
        )
        if node.cordoned and node.pool is not None:
            enqueue_on_commit(tasks.node_uncordon_task, node.pool.backend, node.name)
