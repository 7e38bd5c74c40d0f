"""Demo history: some 60 days of finished jobs for the demo tenants, and what metering
billed for them, so the Cost Explorer, budgets and invoices have something to show on
the first visit (`manage.py seed_demo`).

Each job is what a launch on the demo node pools leaves once it has ended: the spec and
placement `job_submit` records, the audit entry, and the timeline that admission,
dispatch, the watcher and people write through `jobs.state` (the same statuses, actors,
reasons and fields), in the past. No moment of the history holds more GPUs than a pool
has. Nothing here prices usage: the real metering tick bills these jobs as it bills any
job that ran and ended between two ticks, so the ledger, meters, rollups and daily
totals are exactly metering's. Then, as a month's first day would, last month's draft
invoice is made; and an alert-only budget (it never pauses a job).

Deterministic (a `random.Random` per tenant and per job, seeded). Idempotent: every
history job carries the idempotency key `demo-history-NNN`, and a tenant that has one
is skipped.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, Decimal

from django.db import transaction
from django.utils import timezone

from billing.budgets.services import budget_create
from billing.invoices.services import invoice_draft_create, previous_month
from billing.metering import meter_tick
from billing.models import Budget, BudgetAction, Invoice, UsageRecord
from console.models import AuditEvent, Membership, Tenant
from console.permissions import Capability, has_capability
from jobs.actors import BACKEND, SYSTEM, Actor
from jobs.models import FINISHED, Job, JobEvent, JobStatus, Priority, WaitKind
from jobs.state import job_transition_in_past, timeline_event
from marketplace.demo import DEMO_POOLS
from marketplace.models import Image, NodePool, Tier
from marketplace.pricing import node_split

ZERO = Decimal(0)
KEY_PREFIX = "demo-history-"
DEFAULT_SEED = 15
LABELS = {"demo": "history"}
HOME_REGIONS = ("us-west", "eu-central", "us-east")  # the n-th tenant's favourite region
# How often each GPU type is asked for (A100 and H100 above all; others 1.5), and each
# placement: on-demand nodes, spot nodes, or both.
GPU_WEIGHTS = {"h100-80gb": 10, "a100-80gb": 9, "h200-141gb": 3, "a100-40gb": 3}
PLACEMENT_WEIGHTS = {"on_demand": 1.0, "spot": 0.7, "mixed": 0.2}
# What the backends and people write (jobs/backends/kubernetes/observe.py, jobs/services).
RECLAIMED = (
    "rank {rank} disrupted (TerminationByKubelet: Node is shutting down: spot "
    "capacity reclaimed by the provider)"
)
REQUEUED = "requeued as a new attempt from the checkpoint"
# (project, job name, script and arguments, median hours of a successful run on 8 GPUs)
WORKLOADS = [
    ("llm", "llama3-8b-sft", "train.py --config configs/llama3-8b-sft.yaml", 6),
    ("llm", "mistral-7b-dpo", "train_dpo.py --config configs/mistral-7b-dpo.yaml", 4),
    ("llm", "llama3-70b-pretrain", "pretrain.py --config configs/llama3-70b.yaml", 30),
    ("llm", "qwen2-7b-lora", "train.py --config configs/qwen2-7b-lora.yaml --lora-rank 16", 2),
    ("llm", "eval-mmlu", "evaluate.py --tasks mmlu,hellaswag,arc_challenge", 0.5),
    ("vision", "vit-l16-imagenet", "train.py --model vit_large_patch16_224 --epochs 90", 20),
    ("vision", "sdxl-finetune", "train_sdxl.py --resolution 1024 --batch-size 4", 5),
    ("vision", "yolov8-detect", "train.py --data coco.yaml --epochs 100 --imgsz 640", 3),
    ("speech", "whisper-large-ft", "finetune.py --model openai/whisper-large-v3", 8),
    ("recsys", "dlrm-criteo", "dlrm_main.py --dataset /data/criteo-1tb", 10),
]


@dataclass(frozen=True)
class Offer:
    """A placement a launch can get on the demo pools: on-demand, spot, or both."""

    pool: NodePool | None  # for the on-demand nodes
    spot_pool: NodePool | None  # for the spot nodes
    spot_ratio: Decimal
    weight: float

    @property
    def chosen(self) -> NodePool:
        return self.pool or self.spot_pool  # type: ignore[return-value]


@dataclass
class HistoryResult:
    jobs: int
    gpu_hours: Decimal
    days: int
    tenants_skipped: int  # they had history already

    def summary(self) -> str:
        if self.jobs:
            return (
                f"History: {self.jobs:,} past jobs, {self.gpu_hours:,.0f} GPU-hours over "
                f"{self.days} days."
            )
        if self.tenants_skipped:
            return "History: seeded before; nothing added."
        return "History: no demo GPU pools in the catalog; nothing added."


def has_history(tenant: Tenant) -> bool:
    return Job.objects.for_tenant(tenant).filter(idempotency_key__startswith=KEY_PREFIX).exists()


def seed_demo_history(
    tenants: list[Tenant],
    *,
    days: int = 60,
    now: datetime | None = None,
    rng_seed: int = DEFAULT_SEED,
) -> HistoryResult:
    """Past jobs on the demo pools for each tenant that has none yet, billed by the
    metering tick; then last month's draft invoice and an alert-only budget for each."""
    now = now or timezone.now()
    todo = [(index, tenant) for index, tenant in enumerate(tenants) if not has_history(tenant)]
    offers = _offers()
    if not todo or not offers:
        return HistoryResult(0, ZERO, days, len(tenants) - len(todo))
    public = Image.objects.filter(tenant=None, is_active=True).order_by("slug")
    images = [image for image in public if image.framework]  # framework images run training
    plans = [
        plan
        for index, tenant in todo
        for plan in _tenant_plans(tenant, index, offers, images, days, now, rng_seed)
    ]
    fleet = _Fleet()
    jobs, events = [], []
    for plan in sorted(plans, key=lambda p: p.job.created_at):
        timeline = _Timeline(plan.job)
        if _play(plan, timeline, fleet, limit=now - timedelta(minutes=5)):
            jobs.append(plan.job)
            events.append(timeline.events)
    with transaction.atomic():
        Job.objects.bulk_create(jobs)
        for job, job_events in zip(jobs, events, strict=True):
            for event in job_events:
                event.job = job
        JobEvent.objects.bulk_create([e for job_events in events for e in job_events])
        AuditEvent.objects.bulk_create(_launch_audits(jobs))
        meter_tick(now=now)
        for _, tenant in todo:
            _last_month_draft(tenant, now)
            _alert_budget(tenant, now)
    seconds = UsageRecord.objects.filter(job__in=jobs).values_list("gpu_seconds", flat=True)
    gpu_hours = sum(seconds, ZERO) / 3600
    return HistoryResult(len(jobs), gpu_hours, days, len(tenants) - len(todo))


def _offers() -> list[Offer]:
    """Every placement the demo pools allow, each pool picked as launches pick one
    (the most allocatable GPUs, then the first made)."""
    wanted = {(region, gpu, tier) for region, gpu, tier, *_ in DEMO_POOLS}
    pools: dict[tuple, NodePool] = {}
    for pool in (
        NodePool.objects.filter(is_active=True, on_console_host=False, gpu_type__isnull=False)
        .select_related("region", "gpu_type")
        .order_by("-allocatable_gpus", "pk")
    ):
        key = (pool.region.slug, pool.gpu_type.slug, pool.tier)  # type: ignore[union-attr]
        if key in wanted:
            pools.setdefault(key, pool)
    offers = []
    for (region, gpu, tier), pool in pools.items():
        weight = GPU_WEIGHTS.get(gpu, 1.5)
        if tier == Tier.ON_DEMAND:
            offers.append(Offer(pool, None, Decimal(0), weight * PLACEMENT_WEIGHTS["on_demand"]))
            spot = pools.get((region, gpu, Tier.SPOT))
            if spot is not None and spot.backend == pool.backend:
                offers.append(
                    Offer(pool, spot, Decimal("0.5"), weight * PLACEMENT_WEIGHTS["mixed"])
                )
        elif tier == Tier.SPOT:
            offers.append(Offer(None, pool, Decimal(1), weight * PLACEMENT_WEIGHTS["spot"]))
    # Launches never place nodes on a reserved pool (`spec_validate` picks on-demand and
    # spot pools only), so the history has none either.
    return offers


@dataclass
class _Plan:
    job: Job  # unsaved: spec and placement; `_play` writes its timeline
    submitter: Actor  # who launched it
    run_seconds: int  # running time the work needs, over all attempts
    outcome: str  # succeeded, failed, timed_out, cancelled, cancelled_early, preempted, paused
    cut: float  # where in the run the failure, cancel, preemption or pause comes
    rng: random.Random


def _tenant_plans(tenant, index, offers, images, days, now, seed) -> list[_Plan]:
    rng = random.Random(f"{seed}:{tenant.slug}")  # noqa: S311 - demo data, not secrets
    home = HOME_REGIONS[index % len(HOME_REGIONS)]
    weights = [o.weight * (3 if o.chosen.region.slug == home else 1) for o in offers]
    launchers = [
        m.user
        for m in Membership.objects.for_tenant(tenant).select_related("user").order_by("pk")
        if has_capability(m, Capability.LAUNCH_JOBS)
    ]
    runs: dict[str, int] = defaultdict(int)
    plans = []
    start = now - timedelta(days=days)
    for number in range(1, rng.randint(90, 140) + 1):
        job_rng = random.Random(f"{seed}:{tenant.slug}:{number}")  # noqa: S311
        offer = rng.choices(offers, weights)[0]
        project, stem, script, median_hours = rng.choice(WORKLOADS)
        runs[stem] += 1
        user = rng.choice(launchers) if launchers else None
        job = _job(tenant, user, offer, f"{stem}-{runs[stem]:02d}", project, job_rng)
        job.image, job.command = _image_and_command(job, images, script.split(), job_rng)
        # Fewer GPUs take longer over the same work; a run is minutes to about two days.
        hours = median_hours * math.exp(job_rng.gauss(0, 0.6)) * (8 / job.total_gpus) ** 0.5
        run_seconds = int(min(max(hours, 0.15), 44) * 3600)
        outcome = _outcome(job, job_rng)
        if outcome == "timed_out":
            job.max_runtime_minutes = job_rng.choice([120, 240, 360])
            run_seconds = job.max_runtime_minutes * 60 + job_rng.randint(5, 40)
        elif run_seconds > 20 * 3600:
            job.max_runtime_minutes = 72 * 60  # raised for a long training run
        # Submitted early enough to have ended (a pause lasts up to 14 hours).
        margin = run_seconds * 1.1 + (15 if outcome == "paused" else 1) * 3600
        latest = now - timedelta(seconds=margin)
        job.created_at = _submit_time(start, latest, job_rng)
        job.idempotency_key = f"{KEY_PREFIX}{number:03d}"
        submitter = Actor.of_user(user) if user else SYSTEM
        plans.append(
            _Plan(job, submitter, run_seconds, outcome, job_rng.uniform(0.1, 0.8), job_rng)
        )
    return plans


def _job(tenant, user, offer: Offer, name, project, rng) -> Job:
    chosen = offer.chosen
    per_node = min(p.gpus_per_node for p in (offer.pool, offer.spot_pool) if p)
    sizes = [(g, w) for g, w in ((1, 12), (2, 10), (4, 20), (8, 58)) if g <= per_node]
    gpus = rng.choices([g for g, _ in sizes], [w for _, w in sizes])[0]
    nodes = 1
    if gpus == per_node and ((offer.pool and offer.spot_pool) or rng.random() < 0.12):
        nodes = rng.choice([2, 2, 4])
    if offer.pool and offer.spot_pool and nodes == 1:
        nodes = 2
    spot_nodes = node_split(nodes=nodes, spot_ratio=offer.spot_ratio).spot_nodes
    for pool, tier_nodes in ((offer.pool, nodes - spot_nodes), (offer.spot_pool, spot_nodes)):
        if pool and tier_nodes * gpus > pool.total_gpus:
            nodes, spot_nodes = 1, node_split(nodes=1, spot_ratio=offer.spot_ratio).spot_nodes
    on_demand_nodes = nodes - spot_nodes
    return Job(
        tenant=tenant,
        created_by=user,
        name=name,
        project=project,
        labels=dict(LABELS),
        gpu_type=chosen.gpu_type,
        gpus_per_node=gpus,
        nodes=nodes,
        region=chosen.region,
        cpus=max(1, chosen.vcpus_per_node * gpus // max(chosen.gpus_per_node, 1)),
        spot_ratio=offer.spot_ratio,
        backend=chosen.backend,
        pool=offer.pool if on_demand_nodes else None,
        spot_pool=offer.spot_pool if spot_nodes else None,
        spot_nodes=spot_nodes,
        on_demand_nodes=on_demand_nodes,
        priority=Priority.LOW if spot_nodes and rng.random() < 0.2 else Priority.NORMAL,
        checkpoint_path=f"/checkpoints/{name}" if spot_nodes else "",
        status=JobStatus.QUEUED,
        status_reason="waiting for admission",
        wait_kind=WaitKind.ADMISSION,
    )


def _image_and_command(job: Job, images, script: list[str], rng) -> tuple[Image, list[str]]:
    vendor = job.gpu_type.vendor  # type: ignore[union-attr]
    fits = [i for i in images if vendor in i.compatible_with]
    image = rng.choices(fits, [10 if i.framework == "PyTorch" else 3 for i in fits])[0]
    job.image_reference = image.reference
    if job.checkpoint_path:
        script = [*script, "--checkpoint-dir", "$(GPUGEEK_CHECKPOINT_PATH)"]
    gpus, nodes = job.gpus_per_node, job.nodes
    if image.framework == "PyTorch" and nodes > 1:
        launcher = [
            "torchrun",
            f"--nnodes={nodes}",
            f"--nproc-per-node={gpus}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
        ]
    elif image.framework == "PyTorch":
        launcher = ["torchrun", "--standalone", f"--nproc-per-node={gpus}"]
    elif image.framework == "MindSpore":
        launcher = ["msrun", f"--worker_num={gpus * nodes}", f"--local_worker_num={gpus}"]
    else:
        launcher = ["python"]
    return image, [*launcher, *script]


def _outcome(job: Job, rng: random.Random) -> str:
    if job.spot_nodes and rng.random() < 0.2:
        return "preempted"  # then requeued, and the next attempt succeeds
    kinds = ["succeeded", "failed", "timed_out", "cancelled", "cancelled_early", "paused"]
    return rng.choices(kinds, [80, 7, 2, 6, 2, 3])[0]


def _submit_time(start: datetime, latest: datetime, rng: random.Random) -> datetime:
    """Mostly on weekdays and in working hours (UTC)."""
    span = max((latest - start).total_seconds(), 3600)
    while True:
        at = start + timedelta(seconds=int(rng.uniform(0, span)))
        weight = (1.0 if at.weekday() < 5 else 0.35) * (1.0 if 7 <= at.hour < 21 else 0.3)
        if rng.random() < weight:
            return at


class _Fleet:
    """The GPUs history jobs hold in each pool over time: admission's rule (a job starts
    only when its pools have its GPUs free), replayed."""

    def __init__(self) -> None:
        self.held: dict[int, list[tuple[datetime, datetime, int]]] = defaultdict(list)
        self.capacity: dict[int, int] = {}

    def _fits(self, pool_id: int, gpus: int, start: datetime, end: datetime) -> bool:
        spans = [s for s in self.held[pool_id] if s[0] < end and s[1] > start]
        points = [start, *(s[0] for s in spans if s[0] > start)]
        used = (sum(g for s, e, g in spans if s <= p < e) for p in points)
        return all(u + gpus <= self.capacity[pool_id] for u in used)

    def earliest(self, needs: list[tuple[NodePool, int]], at: datetime, seconds: int):
        """The first instant from `at` when every pool has the GPUs free for `seconds`."""
        for pool, _ in needs:
            self.capacity[pool.pk] = pool.total_gpus
        ends = {e for pool, _ in needs for _, e, _ in self.held[pool.pk] if e > at}
        for start in sorted({at, *ends}):
            end = start + timedelta(seconds=seconds)
            if all(self._fits(pool.pk, gpus, start, end) for pool, gpus in needs):
                return start
        return max(ends | {at})

    def hold(self, needs: list[tuple[NodePool, int]], start: datetime, end: datetime) -> None:
        for pool, gpus in needs:
            self.held[pool.pk].append((start, end, gpus))


class _Timeline:
    """A job's timeline written by the state machine (`jobs.state`: the same legality
    check, fields and events) at past instants, on the unsaved job: nothing is locked,
    saved or published (the owner and live pages hear nothing of the past)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.events: list[JobEvent] = []

    def note(self, at: datetime, actor: Actor, reason: str) -> None:
        self.events.append(timeline_event(self.job, actor=actor, reason=reason, at=at))

    def go(self, at: datetime, to: str, actor: Actor, reason: str, **changes) -> datetime:
        event = job_transition_in_past(
            job=self.job, to=to, actor=actor, reason=reason, at=at, **changes
        )
        self.events.append(event)
        return at


def _play(plan: _Plan, timeline: _Timeline, fleet: _Fleet, *, limit: datetime) -> bool:
    """Write the plan's timeline; False when it would not have ended by `limit`."""
    job, rng, outcome, s = plan.job, plan.rng, plan.outcome, timedelta(seconds=1)
    needs = [
        (p, n * job.gpus_per_node)
        for p, n in ((job.pool, job.on_demand_nodes), (job.spot_pool, job.spot_nodes))
        if p
    ]
    timeline.note(job.created_at, plan.submitter, "submitted")
    runs = [plan.run_seconds]
    if outcome == "preempted":  # the rest, from the last checkpoint, after a restore
        first = int(plan.run_seconds * plan.cut)
        runs = [first, plan.run_seconds - first + rng.randint(120, 600)]
    elif outcome in ("failed", "cancelled"):
        runs = [max(60, int(plan.run_seconds * plan.cut))]
    at = job.created_at
    for attempt, run in enumerate(runs, start=1):
        # A launch is admitted in its own transaction when it fits; a requeued attempt
        # waits for the reclaimed spot capacity to come back.
        wait = timedelta(
            milliseconds=rng.randint(5, 300) if attempt == 1 else rng.randint(3, 45) * 60_000
        )
        provisioning = rng.randint(20, 90) + int(job.image.size_gib * 6)
        paused_for = rng.randint(3600, 14 * 3600) if outcome == "paused" else 0
        held = run + provisioning + paused_for + 300
        at = fleet.earliest(needs, at + wait, held)
        admitted = timeline.go(at, JobStatus.DISPATCHING, SYSTEM, "admitted")
        dispatched = at + timedelta(milliseconds=rng.randint(50, 2000))  # the dispatch task
        at = timeline.go(dispatched, JobStatus.PROVISIONING, SYSTEM, "submitted to the cluster")
        at += provisioning * s
        if outcome == "cancelled_early":
            _cancel(timeline, plan, at)
        else:
            at = timeline.go(at, JobStatus.RUNNING, BACKEND, "running") + run * s
        if attempt < len(runs):
            rank = job.on_demand_nodes + rng.randrange(job.spot_nodes)
            timeline.go(at, JobStatus.PREEMPTED, BACKEND, RECLAIMED.format(rank=rank))
            timeline.go(
                at,
                JobStatus.QUEUED,
                SYSTEM,
                REQUEUED,
                attempt=job.attempt + 1,
                assigned_devices=[],
                wait_kind=WaitKind.ADMISSION,
            )
        elif outcome == "paused":
            _pause_and_resume(timeline, plan, at - run * s, run, paused_for)
        elif outcome != "cancelled_early":
            _finish(timeline, plan, at)
        fleet.hold(needs, admitted, job.finished_at or at)
    return job.status in FINISHED and job.finished_at <= limit  # type: ignore[operator]


def _pause_and_resume(timeline: _Timeline, plan: _Plan, running_at, run: int, paused_for: int):
    rng, s = plan.rng, timedelta(seconds=1)
    at = running_at + int(run * plan.cut) * s
    timeline.go(at, JobStatus.PAUSING, plan.submitter, "paused by user")
    stopped = rng.randint(15, 60)
    timeline.go(
        at + stopped * s,
        JobStatus.PAUSED,
        BACKEND,
        "stopped; compute released",
        assigned_devices=[],
    )
    at += (stopped + paused_for) * s
    timeline.go(at, JobStatus.RESUMING, plan.submitter, "resumed by user", paused_by_budget=False)
    at = timeline.go(at + rng.randint(30, 120) * s, JobStatus.RUNNING, BACKEND, "running")
    timeline.go(
        at + (run - int(run * plan.cut)) * s,
        JobStatus.SUCCEEDED,
        BACKEND,
        "completed",
        exit_code=0,
    )


def _cancel(timeline: _Timeline, plan: _Plan, at: datetime) -> None:
    """A cancel as the console records it: `cancelling` until the backend reports the
    work gone (its grace period), then `cancelled`."""
    timeline.go(at, JobStatus.CANCELLING, plan.submitter, "cancelled by user")
    stopped = at + timedelta(seconds=plan.rng.randint(2, 30))
    timeline.go(
        stopped,
        JobStatus.CANCELLED,
        BACKEND,
        "cancelled by user; compute released",
        assigned_devices=[],
    )


def _finish(timeline: _Timeline, plan: _Plan, at: datetime) -> None:
    job, rng = plan.job, plan.rng
    if plan.outcome == "failed":
        rank = rng.randrange(job.nodes)
        code, why = rng.choice([(1, ""), (1, ""), (137, "out of memory (OOMKilled), ")])
        timeline.go(
            at,
            JobStatus.FAILED,
            BACKEND,
            f"rank {rank}: {why}exit code {code}",
            exit_code=code,
        )
    elif plan.outcome == "timed_out":
        reason = f"exceeded the maximum runtime of {job.max_runtime_minutes} minutes"
        timeline.go(at, JobStatus.FAILED, SYSTEM, reason)
    elif plan.outcome == "cancelled":
        _cancel(timeline, plan, at)
    else:
        timeline.go(at, JobStatus.SUCCEEDED, BACKEND, "completed", exit_code=0)


def _launch_audits(jobs: list[Job]) -> list[AuditEvent]:
    """The `job.launched` entries `job_submit` records."""
    return [
        AuditEvent(
            tenant=job.tenant,
            actor=job.created_by,
            created_at=job.created_at,
            actor_label=job.created_by.email if job.created_by else SYSTEM.label,
            action="job.launched",
            target_type="job",
            target_id=str(job.pk),
            target_repr=str(job)[:200],
            metadata={"gpus": job.total_gpus, "nodes": job.nodes, "image": job.image_reference},
        )
        for job in jobs
    ]


def _last_month_draft(tenant: Tenant, now: datetime) -> None:
    """Last month's draft, as the monthly task makes it on the 1st (unless one exists)."""
    start, end = previous_month(now)
    invoiced = Invoice.objects.for_tenant(tenant).filter(period_start__lt=end, period_end__gt=start)
    if _usage(tenant, start, end).exists() and not invoiced.exists():
        invoice_draft_create(tenant=tenant, period_start=start, period_end=end)


def _alert_budget(tenant: Tenant, now: datetime) -> None:
    """A monthly budget at about 1.5 × last month's spend, alert-only: it warns, and
    never pauses a job."""
    if Budget.objects.for_tenant(tenant).exists():
        return
    spend = sum(_usage(tenant, *previous_month(now)).values_list("amount", flat=True), ZERO)
    thousands = (spend * Decimal("1.5") / 1000).quantize(Decimal(1), rounding=ROUND_CEILING)
    members = Membership.objects.for_tenant(tenant).select_related("user").order_by("pk")
    owner = next((m.user for m in members if has_capability(m, Capability.MANAGE_BUDGETS)), None)
    budget_create(
        tenant=tenant,
        user=owner,
        name="Monthly GPU spend",
        amount=max(Decimal(1000), thousands * 1000),
        action=BudgetAction.ALERT_ONLY,
    )


def _usage(tenant: Tenant, start: datetime, end: datetime):
    return UsageRecord.objects.for_tenant(tenant).filter(
        interval_start__gte=start, interval_start__lt=end
    )
