"""Self-healing alert rules: pure functions over samples and log values, and the service
that applies them to a running job (records a JobAlert, notes it in the timeline,
publishes it, and for an idle job with auto-stop on, pauses it), and the job's
self-repair choices resolved against its organisation's defaults.

Rules (thresholds from the issue, overridable in settings):
- utilisation unstable: a GPU's utilisation std-dev over the last 5 min > 15 points;
- memory leak: a GPU's memory used grew > 5 % at each of 3 consecutive samples;
- loss explosion: a `loss=` / `loss:` value in the log above mean + 3σ of the run so far
  (NaN or infinity always counts);
- GPU idle: every GPU of the job under 10 % for GPU_IDLE_MINUTES (default 30).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from statistics import pstdev

from django.conf import settings
from django.db import transaction

from jobs import realtime
from jobs.actors import ALERTS
from jobs.logs.reading import read_lines
from jobs.models import AlertKind, Job, JobAlert, JobMetricSample, JobMonitor, JobStatus
from jobs.notifications import job_repair_notify
from jobs.services import ActionRefused, job_pause
from jobs.state import job_note

log = logging.getLogger(__name__)

UNSTABLE_WINDOW = timedelta(minutes=5)
UNSTABLE_STDDEV = 15.0
UNSTABLE_MIN_SAMPLES = 5
LEAK_GROWTH = 0.05
LEAK_CONSECUTIVE = 3
LOSS_SIGMAS = 3.0
LOSS_MIN_VALUES = 10
IDLE_UTILIZATION = 10.0
LOG_SCAN_LINES = 20000  # per tick: a huge backlog is scanned over several ticks

LOSS_VALUE = re.compile(
    r"\bloss\s*[=:]\s*(?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)",
    re.IGNORECASE,
)


# --- pure rules -------------------------------------------------------------------------------


def utilization_unstable(
    series: Sequence[tuple[datetime, float]],
    now: datetime,
    *,
    window: timedelta = UNSTABLE_WINDOW,
    threshold: float = UNSTABLE_STDDEV,
    min_samples: int = UNSTABLE_MIN_SAMPLES,
) -> bool:
    """One GPU's (time, utilisation %) readings: is their std-dev over `window` above
    `threshold` points? Needs `min_samples` readings in the window."""
    recent = [value for at, value in series if now - window <= at <= now]
    return len(recent) >= min_samples and pstdev(recent) > threshold


def memory_leak(
    values: Sequence[float],
    *,
    growth: float = LEAK_GROWTH,
    consecutive: int = LEAK_CONSECUTIVE,
) -> bool:
    """One GPU's memory used, oldest first: did each of the last `consecutive` samples
    grow by more than `growth` over the one before?"""
    if len(values) < consecutive + 1:
        return False
    tail = values[-(consecutive + 1) :]
    return all(
        previous > 0 and current > previous * (1 + growth) for previous, current in pairwise(tail)
    )


@dataclass(frozen=True)
class RunningStats:
    """Mean and M2 of a series (Welford), so a long run's loss history is three numbers."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, value: float) -> RunningStats:
        count = self.count + 1
        delta = value - self.mean
        mean = self.mean + delta / count
        return RunningStats(count, mean, self.m2 + delta * (value - mean))

    @property
    def stddev(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0

    @classmethod
    def of(cls, values: Iterable[float]) -> RunningStats:
        stats = cls()
        for value in values:
            stats = stats.add(value)
        return stats


def loss_explodes(
    history: RunningStats,
    value: float,
    *,
    sigmas: float = LOSS_SIGMAS,
    min_values: int = LOSS_MIN_VALUES,
) -> bool:
    """Is `value` above mean + `sigmas`·σ of the run's earlier losses (`history`)?

    NaN and ±infinity always explode. With fewer than `min_values` earlier values the
    statistics mean nothing yet: no alert. A run of identical losses (σ = 0) alerts only
    on a value above that constant by more than rounding noise."""
    if math.isnan(value) or math.isinf(value):
        return True
    if history.count < min_values:
        return False
    limit = history.mean + sigmas * history.stddev
    noise = 1e-9 * max(1.0, abs(history.mean))
    return value > limit + noise


def loss_values(text: str) -> list[float]:
    """The `loss=` / `loss:` values in one log line (`val_loss` is not the training loss)."""
    return [float(m["value"]) for m in LOSS_VALUE.finditer(text)]


def gpu_idle(
    series: Sequence[tuple[datetime, float]],
    now: datetime,
    *,
    idle_for: timedelta,
    threshold: float = IDLE_UTILIZATION,
) -> bool:
    """(time, busiest GPU's utilisation %) of a job: below `threshold` for all of the
    last `idle_for`? Counted are the readings inside the period and the last one before
    it (the state at its start), so the readings must reach back that far: a job that
    just started, or whose readings stopped, is not called idle."""
    start = now - idle_for
    before = [(at, value) for at, value in series if at <= start]
    if not before:
        return False
    window = [max(before)[1]] + [value for at, value in series if start < at <= now]
    return all(value < threshold for value in window)


# --- applying them to a job --------------------------------------------------------------------


@dataclass(frozen=True)
class SelfRepairChoices:
    """What self-repair does for one job now: its own choice where it made one, else its
    organisation's current default."""

    hardware_repair: bool
    loss_explosion_pause: bool


def self_repair_choices(*, job: Job, monitor: JobMonitor | None) -> SelfRepairChoices:
    """The one place a job's self-repair choice meets its organisation's default (a None
    choice follows the default, so changing the default changes every such job)."""
    tenant = job.tenant

    def chosen(own: bool | None, default: bool) -> bool:
        return default if own is None else own

    return SelfRepairChoices(
        hardware_repair=chosen(
            monitor.hardware_repair if monitor else None, tenant.hardware_repair_default
        ),
        loss_explosion_pause=chosen(
            monitor.loss_explosion_pause if monitor else None, tenant.loss_explosion_pause_default
        ),
    )


def _idle_minutes(monitor: JobMonitor | None) -> int:
    if monitor is not None and monitor.idle_minutes:
        return monitor.idle_minutes
    return settings.GPU_IDLE_MINUTES


def alert_raise(
    *, job: Job, kind: str, message: str, now: datetime, severity: str = "warning"
) -> JobAlert | None:
    """Record and publish an alert unless the same kind was raised within the cool-down.
    The alert is also a timeline entry (actor "alerts")."""
    cooldown = timedelta(minutes=settings.ALERT_COOLDOWN_MINUTES)
    with transaction.atomic():
        if JobAlert.objects.filter(job=job, kind=kind, at__gt=now - cooldown).exists():
            return None
        alert = JobAlert.objects.create(
            job=job,
            kind=kind,
            severity=severity,
            message=message[:500],
            at=now,
            attempt=job.attempt,
        )
        job_note(job=job, actor=ALERTS, reason=message)
        realtime.publish_job_alert(job, kind=kind, severity=severity, message=message, at=now)
    return alert


def _series(samples: list[JobMetricSample], field: str) -> dict[tuple[str, int], list]:
    by_gpu: dict[tuple[str, int], list] = defaultdict(list)
    for sample in samples:
        value = getattr(sample, field)
        if value is not None:
            by_gpu[(sample.node, sample.gpu)].append((sample.at, value))
    return by_gpu


def alerts_evaluate(*, job: Job, now: datetime) -> list[JobAlert]:
    """Apply every rule to a running job's recent samples and new log lines."""
    monitor = JobMonitor.objects.filter(job=job).first()
    raised: list[JobAlert | None] = []
    idle_for = timedelta(minutes=_idle_minutes(monitor))
    horizon = now - max(idle_for, UNSTABLE_WINDOW) - timedelta(minutes=1)
    samples = list(JobMetricSample.objects.filter(job=job, at__gte=horizon).order_by("at"))
    if samples:
        utilization = _series(samples, "utilization")
        for (node, gpu), series in utilization.items():
            if utilization_unstable(series, now):
                raised.append(
                    alert_raise(
                        job=job,
                        kind=AlertKind.UTILIZATION_UNSTABLE,
                        message=f"GPU utilisation unstable on {node} GPU {gpu}: std-dev "
                        f"over 5 min above {UNSTABLE_STDDEV:g} points",
                        now=now,
                    )
                )
                break
        for (node, gpu), series in _series(samples, "memory_used_mib").items():
            if memory_leak([value for _, value in series]):
                raised.append(
                    alert_raise(
                        job=job,
                        kind=AlertKind.MEMORY_LEAK,
                        message=f"Possible GPU memory leak on {node} GPU {gpu}: memory used "
                        f"grew more than {LEAK_GROWTH:.0%} at {LEAK_CONSECUTIVE} samples in a row",
                        now=now,
                    )
                )
                break
        busiest: dict[datetime, float] = {}
        for sample in samples:
            if sample.utilization is not None:
                busiest[sample.at] = max(busiest.get(sample.at, 0.0), sample.utilization)
        if gpu_idle(sorted(busiest.items()), now, idle_for=idle_for):
            auto_stop = monitor is not None and monitor.idle_auto_stop
            minutes = int(idle_for.total_seconds() // 60)
            alert = alert_raise(
                job=job,
                kind=AlertKind.GPU_IDLE,
                severity="critical" if auto_stop else "warning",
                message=f"GPUs idle (under {IDLE_UTILIZATION:g} % utilisation) for "
                f"{minutes} min" + ("; pausing the job (auto-stop)" if auto_stop else ""),
                now=now,
            )
            raised.append(alert)
            if alert is not None and auto_stop and job.status == JobStatus.RUNNING:
                with contextlib.suppress(ActionRefused):  # paused or ended meanwhile
                    job_pause(
                        job=job, actor=ALERTS, reason=f"auto-stop: GPUs idle for {minutes} min"
                    )
    raised.append(alerts_scan_logs(job=job, now=now))
    return [a for a in raised if a is not None]


def alerts_scan_logs(*, job: Job, now: datetime) -> JobAlert | None:
    """Read the job's new log lines for loss values; alert on the first explosion."""
    monitor, _ = JobMonitor.objects.get_or_create(job=job)
    page = read_lines(job, since_line=monitor.log_scanned_line, limit=LOG_SCAN_LINES)
    if not page["lines"]:
        return None
    stats = RunningStats(monitor.loss_count, monitor.loss_mean, monitor.loss_m2)
    exploded: tuple[int, float, RunningStats] | None = None
    for line in page["lines"]:
        for value in loss_values(line["text"]):
            if exploded is None and loss_explodes(stats, value):
                exploded = (line["line_no"], value, stats)
            if math.isfinite(value):
                stats = stats.add(value)
    JobMonitor.objects.filter(pk=monitor.pk).update(
        log_scanned_line=page["next_line"],
        loss_count=stats.count,
        loss_mean=stats.mean,
        loss_m2=stats.m2,
    )
    if exploded is None:
        return None
    line_no, value, before = exploded
    measured = (
        f"loss {value:g} at log line {line_no} is above the run's mean + {LOSS_SIGMAS:g}σ "
        f"(mean {before.mean:.4g}, σ {before.stddev:.4g} over {before.count} values)"
    )
    choices = self_repair_choices(job=job, monitor=monitor)
    pause = choices.loss_explosion_pause and job.status == JobStatus.RUNNING
    alert = alert_raise(
        job=job,
        kind=AlertKind.LOSS_EXPLOSION,
        severity="critical",
        message=f"Loss explosion: {measured}" + ("; pausing the job" if pause else ""),
        now=now,
    )
    if alert is not None and pause:
        reason = f"self-repair, loss explosion: {measured}"
        with contextlib.suppress(ActionRefused):  # paused or ended meanwhile
            job_pause(job=job, actor=ALERTS, reason=reason)
            job_repair_notify(job, "was paused: its loss exploded", reason)
    return alert


class Unchanged(enum.Enum):
    """A choice the caller left out of `job_monitor_set` (None means "the default")."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED


def job_monitor_set(
    *,
    job: Job,
    idle_auto_stop: bool,
    idle_minutes: int | None,
    loss_explosion_pause: bool | Unchanged | None = UNCHANGED,
    hardware_repair: bool | Unchanged | None = UNCHANGED,
) -> JobMonitor:
    """The job's GPU-idle auto-stop choice (None minutes: the installation's default) and
    its self-repair choices: whether a loss explosion pauses it and whether a hardware
    fault moves it to another node (None: its organisation's default; left out:
    unchanged)."""
    monitor, _ = JobMonitor.objects.get_or_create(job=job)
    monitor.idle_auto_stop = idle_auto_stop
    monitor.idle_minutes = idle_minutes
    if loss_explosion_pause is not UNCHANGED:
        monitor.loss_explosion_pause = loss_explosion_pause
    if hardware_repair is not UNCHANGED:
        monitor.hardware_repair = hardware_repair
    monitor.save(
        update_fields=["idle_auto_stop", "idle_minutes", "loss_explosion_pause", "hardware_repair"]
    )
    return monitor
