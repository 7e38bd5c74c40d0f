"""Runtime prediction: how long a job will run, from its tenant's history of similar
finished jobs. Pure: the history is handed in (`jobs.expectations.selectors` reads it).

Similar means, in this order of preference, the same project, the same launch template,
the same image, the same GPU type (CPU-only jobs are one "GPU type"): the first of these
with at least `MIN_SAMPLES` succeeded runs gives the median and the 90th percentile of
their running time. Without enough history the job's own `max_runtime_minutes` is the
prediction (it is killed then at the latest). A prediction never exceeds that limit."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

# Fewer runs than this say too little: the next kind of similarity is tried.
MIN_SAMPLES = 3
# The most recent runs of one kind that count (older ones describe older code).
SAMPLES_PER_KEY = 100

Basis = Literal["project", "launch_template", "image", "gpu_type", "max_runtime"]
BASES: tuple[Basis, ...] = ("project", "launch_template", "image", "gpu_type")
BASIS_LABELS: dict[str, str] = {
    "project": "in the same project",
    "launch_template": "from the same launch template",
    "image": "with the same image",
    "gpu_type": "on the same GPU type",
    "max_runtime": "its maximum runtime",
}

# (basis, tenant id, value): one bucket of history.
HistoryKey = tuple[str, int, object]


class SimilarJob(Protocol):
    """What a job (a model row, or a test's stand-in) tells about its kind."""

    tenant_id: int
    project: str
    launch_template_id: int | None
    image_id: int
    gpu_type_id: int | None
    max_runtime_minutes: int


class StoredSimilarJob(SimilarJob, Protocol):
    """A similar job with its key (predictions of many are returned by it)."""

    pk: int


@dataclass(frozen=True)
class RuntimePrediction:
    """A job's predicted running time; `basis` says which history (or none) it rests on."""

    median_seconds: float
    p90_seconds: float
    samples: int
    basis: Basis

    @property
    def basis_label(self) -> str:
        return BASIS_LABELS[self.basis]

    def as_dict(self) -> dict:
        return {
            "median_seconds": round(self.median_seconds),
            "p90_seconds": round(self.p90_seconds),
            "samples": self.samples,
            "basis": self.basis,
        }


def similarity_keys(job: SimilarJob) -> list[HistoryKey]:
    """The history buckets that describe `job`, most similar first (a job without a
    project or a template skips those)."""
    keys: list[HistoryKey] = []
    if job.project:
        keys.append(("project", job.tenant_id, job.project))
    if job.launch_template_id:
        keys.append(("launch_template", job.tenant_id, job.launch_template_id))
    keys.append(("image", job.tenant_id, job.image_id))
    keys.append(("gpu_type", job.tenant_id, job.gpu_type_id))
    return keys


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (a value that occurred, never an interpolation)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def predict_runtime(
    job: SimilarJob, history: Mapping[HistoryKey, Sequence[float]]
) -> RuntimePrediction:
    """`job`'s predicted running time from `history` (running seconds of succeeded jobs
    per bucket, most recent first)."""
    limit = job.max_runtime_minutes * 60.0
    for key in similarity_keys(job):
        runs = list(history.get(key, ()))[:SAMPLES_PER_KEY]
        if len(runs) >= MIN_SAMPLES:
            return RuntimePrediction(
                median_seconds=min(statistics.median(runs), limit),
                p90_seconds=min(percentile(runs, 0.9), limit),
                samples=len(runs),
                basis=key[0],  # type: ignore[arg-type]
            )
    return RuntimePrediction(limit, limit, 0, "max_runtime")


def predict_runtimes(
    jobs: Iterable[StoredSimilarJob], history: Mapping[HistoryKey, Sequence[float]]
) -> dict[int, RuntimePrediction]:
    """`predict_runtime` of each job by its pk, made once per kind of job (what a
    prediction reads of it): a queue is mostly a few kinds of job many times over."""
    by_kind: dict[tuple, RuntimePrediction] = {}
    predictions: dict[int, RuntimePrediction] = {}
    for job in jobs:
        kind = (*similarity_keys(job), job.max_runtime_minutes)
        if kind not in by_kind:
            by_kind[kind] = predict_runtime(job, history)
        predictions[job.pk] = by_kind[kind]
    return predictions


def history_from_rows(rows: Sequence[tuple[int, str, int | None, int, int | None, float]]):
    """Buckets (`HistoryKey` → running seconds, most recent first) from finished jobs'
    rows (tenant, project, template, image, GPU type, running seconds), newest first."""
    history: dict[HistoryKey, list[float]] = {}
    for tenant_id, project, template_id, image_id, gpu_type_id, seconds in rows:
        values = {
            "project": project or None,
            "launch_template": template_id,
            "image": image_id,
            "gpu_type": gpu_type_id,
        }
        for basis, value in values.items():
            if value is None and basis != "gpu_type":
                continue
            bucket = history.setdefault((basis, tenant_id, value), [])
            if len(bucket) < SAMPLES_PER_KEY:
                bucket.append(seconds)
    return history
