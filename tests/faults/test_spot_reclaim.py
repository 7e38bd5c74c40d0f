"""Issue 15, fault test 5: the provider reclaims spot capacity (pods disrupted with a
`DisruptionTarget` condition, `TerminationByKubelet`, as `SandboxCluster.reclaim_spot`
does) while multi-node jobs run on it. Each attempt ends, a new attempt starts with
GPUGEEK_RESUMED=1 and the checkpoint path and resumes from its checkpoint, no job is ever
shown as failed, and the ledger bills exactly the seconds that ran.

Three jobs of 4 GPUs a node: 2 nodes all spot, 3 nodes (1 on-demand + 2 spot), 4 nodes
(2 + 2). The test drives the watcher's pass (`jobs_observe`), the dispatch task's service
and metering ticks itself, the ticks on the clock it chooses (`meter_tick(now=…)`, the
wall clock the state machine stamps events with), with a repeated and a late tick among
them. The billed seconds are checked against the running spans read from the job's
events, per tier, exactly (the test's clock keeps whole milliseconds, the ledger's
GPU-seconds' quantum).
"""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal
from itertools import pairwise

import pytest
from django.utils import timezone

from billing.metering import meter_tick
from billing.models import AMOUNT_QUANTUM, UsageRecord
from jobs import services
from jobs.backends import get_backend
from jobs.backends.kubernetes import manifests
from jobs.models import BILLED_STATUSES, Job, JobEvent, JobStatus
from jobs.services import JobSpec
from marketplace.models import PriceEntry, PriceVersion
from tests.faults.kube_helpers import (
    H100_ON_DEMAND,
    H100_SPOT,
    live_pods,
    report,
    start_sandbox,
)

GPUS = 4
SHAPES = [(2, Decimal("1")), (3, Decimal("0.67")), (4, Decimal("0.5"))]  # nodes, spot ratio
DURATION = 8  # seconds of simulated training per job (2 steps a second)


def spec(index: int, nodes: int, spot_ratio: Decimal) -> JobSpec:
    return JobSpec(
        name=f"reclaimed-{index}",
        image="pytorch-2-5-cuda12-4",
        command=["torchrun", "train.py"],
        gpu_type="h100-80gb",
        gpus_per_node=GPUS,
        cpus=8,
        nodes=nodes,
        spot_ratio=spot_ratio,
        region="us-west",
        checkpoint_path=f"/ckpt/run-{index}",
        env={"SANDBOX_DURATION_SECONDS": str(DURATION), "SANDBOX_CHECKPOINT_SECONDS": "1"},
    )


class Driver:
    """The watcher, the dispatch task and the metering beat, one step at a time."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs
        self.ticks = 0
        self.seen: set[str] = set()

    def step(self) -> None:
        services.jobs_observe(backend_name="kubernetes")
        for job in self.jobs:
            job.refresh_from_db()
            if job.status == JobStatus.DISPATCHING:  # what the queued dispatch task does
                services.job_dispatch(job=job)
                job.refresh_from_db()
            self.seen.add(job.status)
        self.tick(timezone.now())

    def tick(self, now) -> None:
        meter_tick(now=now)
        self.ticks += 1

    def until(self, done, what: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                states = [(j.pk, j.status, j.attempt, j.status_reason) for j in self.jobs]
                raise AssertionError(f"{what}: not within {timeout} s: {states}")
            self.step()
            time.sleep(0.2)


def log_lines(job: Job) -> list[str]:
    return [line.text for line in get_backend("kubernetes").logs(job)]


def running_spans(job: Job) -> list[tuple]:
    """(start, end, attempt) of the job's billed time, read from its events: a span opens
    when it enters a billed status and closes when it leaves them."""
    spans, opened = [], None
    for event in JobEvent.objects.filter(job=job).order_by("at", "pk"):
        if event.to_status in BILLED_STATUSES and opened is None:
            opened = (event.at, event.attempt)
        elif event.to_status not in BILLED_STATUSES and opened is not None:
            spans.append((opened[0], event.at, opened[1]))
            opened = None
    assert opened is None, "the job is still billed"
    return spans


@pytest.fixture
def millisecond_clock(monkeypatch):
    """The wall clock, to the millisecond: the state machine stamps events with it and the
    test ticks with it, so every billed interval is whole milliseconds and the ledger's
    GPU-seconds (kept to the millisecond) can be compared with the spans exactly."""
    real_now = timezone.now

    def now():
        at = real_now()
        return at.replace(microsecond=at.microsecond - at.microsecond % 1000)

    monkeypatch.setattr(timezone, "now", now)


@pytest.mark.faults
def test_spot_reclaim_resumes_from_the_checkpoint_and_bills_what_ran(
    world, settings, tmp_path, millisecond_clock
):
    started = time.monotonic()
    cluster = start_sandbox(settings, tmp_path, {H100_ON_DEMAND: 2, H100_SPOT: 3})
    server = cluster.server
    try:
        jobs = []
        for index, (nodes, ratio) in enumerate(SHAPES):
            job = services.job_submit(
                tenant=world.tenant, user=world.member, spec=spec(index, nodes, ratio)
            )
            assert job.status == JobStatus.DISPATCHING, job.status_reason
            jobs.append(services.job_dispatch(job=job))
        assert [(j.on_demand_nodes, j.spot_nodes) for j in jobs] == [(0, 2), (1, 2), (2, 2)]
        drive = Driver(jobs)

        # Running, each rank 0 has saved a checkpoint.
        drive.until(
            lambda: all(
                j.status == JobStatus.RUNNING
                and any(
                    f"saved checkpoint /ckpt/run-{i}/step-" in t and "(rank 0)" in t
                    for t in log_lines(j)
                )
                for i, j in enumerate(jobs)
            ),
            "running with a checkpoint",
        )
        first_pods = {j.pk: live_pods(server, j) for j in jobs}
        assert all(
            p["metadata"]["annotations"].get(manifests.RESUMED_ANNOTATION, "0") == "0"
            for pods in first_pods.values()
            for p in pods
        )
        now = timezone.now()
        drive.tick(now)
        drive.tick(now)  # a repeated tick
        drive.tick(now - timedelta(seconds=1))  # a late tick, with an earlier clock

        evicted = cluster.reclaim_spot(H100_SPOT)["evicted_pods"]
        assert len(evicted) == sum(j.spot_nodes for j in jobs)

        # Each attempt ends; the job is requeued as attempt 2 and started again.
        drive.until(
            lambda: all(j.attempt == 2 and j.status == JobStatus.RUNNING for j in jobs), "attempt 2"
        )
        resumed_at = {}
        for index, job in enumerate(jobs):
            preempted = JobEvent.objects.get(job=job, to_status=JobStatus.PREEMPTED)
            assert preempted.attempt == 1
            assert "TerminationByKubelet" in preempted.reason, preempted.reason
            ns = manifests.namespace_name(job.tenant_id)
            kube_jobs = server.list("jobs", ns, label_selector=f"{manifests.JOB_LABEL}={job.pk}")
            attempts = {k["metadata"]["labels"][manifests.ATTEMPT_LABEL] for k in kube_jobs}
            assert attempts == {"2"}, attempts  # attempt 1's Jobs are gone
            pods = live_pods(server, job)
            assert len(pods) == job.nodes
            assert not {p["metadata"]["name"] for p in pods} & {
                p["metadata"]["name"] for p in first_pods[job.pk]
            }
            for pod in pods:
                assert pod["metadata"]["labels"][manifests.ATTEMPT_LABEL] == "2"
                assert pod["metadata"]["annotations"][manifests.RESUMED_ANNOTATION] == "1"
                env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
                assert env["GPUGEEK_CHECKPOINT_PATH"]["value"] == f"/ckpt/run-{index}"
                assert env["GPUGEEK_ATTEMPT"]["value"] == "2"
                path = env["GPUGEEK_RESUMED"]["valueFrom"]["fieldRef"]["fieldPath"]
                assert path == f"metadata.annotations['{manifests.RESUMED_ANNOTATION}']"
            # What the program sees: resumed, from the checkpoint path, at a step past 0.
            deadline = time.monotonic() + 10
            while not any("GPUGEEK_RESUMED=1" in t for t in log_lines(job)):
                assert time.monotonic() < deadline, log_lines(job)[:5]
                time.sleep(0.1)
            line = next(t for t in log_lines(job) if "GPUGEEK_RESUMED=1" in t)
            assert line.startswith(f"GPUGEEK_RESUMED=1: resuming from /ckpt/run-{index} at step ")
            resumed_at[job.pk] = int(line.rsplit(" ", 1)[-1])
            assert resumed_at[job.pk] > 0

        # The rest of the work, then a last tick after the end.
        drive.until(
            lambda: all(j.status in (JobStatus.SUCCEEDED, JobStatus.FAILED) for j in jobs),
            "the end",
        )
        now = timezone.now()
        drive.tick(now)
        drive.tick(now + timedelta(seconds=30))
    finally:
        cluster.stop()
    assert server.errors == []

    failed_events = JobEvent.objects.filter(job__in=jobs, to_status=JobStatus.FAILED).count()
    assert failed_events == 0 and JobStatus.FAILED not in drive.seen
    assert {j.status for j in jobs} == {JobStatus.SUCCEEDED}

    version = PriceVersion.objects.order_by("-effective_from").first()
    on_demand_price = PriceEntry.objects.get(
        version=version, gpu_type=jobs[0].gpu_type, region=jobs[0].region
    ).on_demand_price
    billed = spanned = Decimal(0)
    records = overlaps = 0
    for job in jobs:
        spans = running_spans(job)
        assert [a for _, _, a in spans] == [1, 2]
        for tier, nodes in (("on_demand", job.on_demand_nodes), ("spot", job.spot_nodes)):
            rows = list(
                UsageRecord.objects.filter(job_ref=job.pk, tier=tier).order_by("interval_start")
            )
            if not nodes:
                assert rows == []
                continue
            records += len(rows)
            overlaps += sum(1 for a, b in pairwise(rows) if b.interval_start < a.interval_end)
            # The records tile the running spans exactly: no gap, no overlap, nothing else.
            pieces = [(r.interval_start, r.interval_end, r.attempt) for r in rows]
            assert _merged(pieces) == spans, (tier, pieces, spans)
            ran = sum(((end - start) for start, end, _ in spans), timedelta())
            assert sum(((r.interval_end - r.interval_start) for r in rows), timedelta()) == ran
            units = nodes * GPUS
            price = on_demand_price
            if tier == "spot":
                price = on_demand_price * (100 - version.spot_discount_percent) / 100
            for r in rows:
                seconds = _seconds(r.interval_end - r.interval_start)
                assert r.units == units and r.cpu_seconds == 0
                assert r.gpu_seconds == (seconds * units).quantize(Decimal("0.001"))
                assert abs(r.unit_price - price) <= AMOUNT_QUANTUM, (r.unit_price, price)
                assert r.amount == (r.gpu_seconds * r.unit_price / 3600).quantize(AMOUNT_QUANTUM)
            billed += sum(r.gpu_seconds for r in rows)
            spanned += _seconds(ran) * units
    assert overlaps == 0
    # Σ billed GPU-seconds = Σ running seconds × GPUs, exactly.
    assert billed == spanned

    line = (
        f"FAULTS spot-reclaim: jobs={len(jobs)} nodes={sum(j.nodes for j in jobs)} "
        f"evicted_pods={len(evicted)} preempted={len(jobs)} "
        f"resumed_from_steps={sorted(resumed_at.values())} failed_events={failed_events} "
        f"ticks={drive.ticks} records={records} billed_gpu_seconds={billed} "
        f"ran_gpu_seconds={spanned} lost=0 doubled={overlaps} "
        f"seconds={time.monotonic() - started:.1f}"
    )
    report(line)


def _seconds(delta: timedelta) -> Decimal:
    return Decimal(delta // timedelta(microseconds=1)) / Decimal(1_000_000)


def _merged(pieces: list[tuple]) -> list[tuple]:
    """Adjacent pieces of one attempt joined; overlapping ones are left apart (so an
    overlap, or a gap, never looks like the span it should tile)."""
    merged: list[list] = []
    for start, end, attempt in pieces:
        if merged and merged[-1][1] == start and merged[-1][2] == attempt:
            merged[-1][1] = end
        else:
            merged.append([start, end, attempt])
    return [tuple(m) for m in merged]
