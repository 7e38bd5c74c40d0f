"""Runtime-prediction error: a synthetic history of three tenants' jobs (deterministic
seed) is replayed through one GPU pool in admission's order, and at each moment the
console's own functions (jobs.expectations: `predict_runtime` over the history finished
so far, `simulate_starts` over the running jobs and the queue) say when each job will end
and start. Figures: the median absolute error of the expected end (taken when a job
starts) and of the expected start (taken when a job is queued), against the same
estimates made from max_runtime_minutes alone. Pure Python, no database; it asserts only
that every job ran and the history was used, never a figure.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field

from jobs.expectations.runtime import (
    SAMPLES_PER_KEY,
    history_from_rows,
    predict_runtime,
)
from jobs.expectations.simulation import Holder, Waiter, simulate_starts
from tests.bench.results import bench_size, record

SEED = 20261203
JOBS = 300 if bench_size() == "smoke" else 3000
POOL_GPUS = 16
POOL = ("pool", 1)
# Offered load: strict queue order leaves GPUs idle behind a big job, so well below 1.
TARGET_UTILISATION = 0.6


@dataclass
class SyntheticJob:
    """A replayed job: its kind (what predicts it) and its true running time."""

    job_id: int
    tenant_id: int
    project: str
    image_id: int
    gpus: int
    runtime: float  # seconds, the truth the predictions don't see
    max_runtime_minutes: int
    arrival: float
    launch_template_id: int | None = None
    gpu_type_id: int | None = 1
    start: float | None = None
    expected_start: dict[str, float | None] = field(default_factory=dict)
    expected_end: dict[str, float] = field(default_factory=dict)


def synthetic_jobs(rng: random.Random) -> list[SyntheticJob]:
    """Three tenants, four projects each with their own typical runtime (lognormal,
    20 % spread) and GPU count; one job in five has no project (its image predicts)."""
    kinds = []
    for tenant_id in (1, 2, 3):
        for number in range(4):
            typical = rng.choice([10, 20, 45, 90, 180]) * 60.0
            kinds.append((tenant_id, f"p{number}", typical, rng.choice([1, 2, 4, 8])))
    mean_gpu_seconds = statistics.mean(typical * gpus for _, _, typical, gpus in kinds)
    gap = mean_gpu_seconds / (POOL_GPUS * TARGET_UTILISATION)
    jobs, clock = [], 0.0
    for job_id in range(JOBS):
        tenant_id, project, typical, gpus = rng.choice(kinds)
        clock += rng.expovariate(1 / gap)
        runtime = typical * math.exp(rng.gauss(0, 0.2))
        limit = math.ceil(typical * 4 / 60)
        jobs.append(
            SyntheticJob(
                job_id=job_id,
                tenant_id=tenant_id,
                project=project if rng.random() > 0.2 else "",
                image_id=tenant_id * 10 + (1 if typical < 3600 else 2),
                gpus=gpus,
                runtime=min(runtime, limit * 60.0),
                max_runtime_minutes=limit,
                arrival=clock,
            )
        )
    return jobs


class Replay:
    """One pool, strict queue order (admission's no overtaking), the true runtimes."""

    def __init__(self) -> None:
        self.history: dict = {}
        self.running: dict[int, SyntheticJob] = {}
        self.ends: list[tuple[float, int]] = []
        self.queue: deque[SyntheticJob] = deque()
        self.used = 0

    def predicted(self, job: SyntheticJob, way: str) -> float:
        if way == "max runtime":
            return job.max_runtime_minutes * 60.0
        return predict_runtime(job, self.history).median_seconds

    def estimate_starts(self, now: float, way: str) -> dict[int, float | None]:
        """What the console would say now of each queued job's start (replay time)."""
        holders = [
            Holder({POOL: job.gpus}, max(job.start + self.predicted(job, way) - now, 0.0))
            for job in self.running.values()
            if job.start is not None
        ]
        queue = [
            Waiter(job_id=job.job_id, pool_needs={POOL: job.gpus}, runtime=self.predicted(job, way))
            for job in self.queue
        ]
        offsets = simulate_starts(capacity={POOL: POOL_GPUS}, holders=holders, queue=queue)
        return {job_id: None if at is None else now + at for job_id, at in offsets.items()}

    def finish(self, now: float) -> None:
        while self.ends and self.ends[0][0] <= now:
            _, job_id = heapq.heappop(self.ends)
            job = self.running.pop(job_id)
            self.used -= job.gpus
            row = (job.tenant_id, job.project, None, job.image_id, job.gpu_type_id, job.runtime)
            for key, seconds in history_from_rows([row]).items():
                bucket = self.history.setdefault(key, [])
                bucket.insert(0, seconds[0])
                del bucket[SAMPLES_PER_KEY:]

    def admit(self, now: float) -> None:
        while self.queue and self.used + self.queue[0].gpus <= POOL_GPUS:
            job = self.queue.popleft()
            job.start = now
            for way in ("history", "max runtime"):
                job.expected_end[way] = now + self.predicted(job, way)
            self.used += job.gpus
            self.running[job.job_id] = job
            heapq.heappush(self.ends, (now + job.runtime, job.job_id))

    def run(self, jobs: list[SyntheticJob]) -> None:
        arrivals = deque(jobs)
        while arrivals or self.queue or self.running:
            next_end = self.ends[0][0] if self.ends else math.inf
            if arrivals and arrivals[0].arrival <= next_end:
                job = arrivals.popleft()
                now = job.arrival
                self.finish(now)
                self.admit(now)
                self.queue.append(job)
                for way in ("history", "max runtime"):
                    job.expected_start[way] = self.estimate_starts(now, way)[job.job_id]
                self.admit(now)
            else:
                self.finish(next_end)
                self.admit(next_end)


def median_minutes(errors: list[float]) -> float:
    return statistics.median(errors) / 60 if errors else 0.0


def test_runtime_prediction_error():
    jobs = synthetic_jobs(random.Random(SEED))
    replay = Replay()
    replay.run(jobs)
    assert all(job.start is not None for job in jobs)
    warm = jobs[len(jobs) // 10 :]  # the first tenth builds the history
    end_errors = {
        way: [abs(job.expected_end[way] - (job.start + job.runtime)) for job in warm]
        for way in ("history", "max runtime")
    }
    waited = [job for job in warm if job.start > job.arrival + 1]
    start_errors = {
        way: [
            abs(job.expected_start[way] - job.start)
            for job in waited
            if job.expected_start[way] is not None
        ]
        for way in ("history", "max runtime")
    }
    from_history = sum(1 for job in warm if predict_runtime(job, replay.history).samples)
    assert from_history > len(warm) / 2
    figures = [
        ("expected end, median abs error", end_errors),
        ("expected start (queued jobs), median abs error", start_errors),
    ]
    print(f"\n{len(jobs)} jobs replayed, {len(waited)} of them queued; seed {SEED}")
    for figure, errors in figures:
        ours, baseline = median_minutes(errors["history"]), median_minutes(errors["max runtime"])
        print(f"{figure}: {ours:.1f} min (max runtime alone: {baseline:.1f} min)")
        record(
            "queue",
            figure,
            ours,
            "min",
            baseline=f"max_runtime_minutes alone: {baseline:.1f} min",
            ratio=ours / baseline if baseline else None,
        )
