"""The idle rule of environments, as pure functions over activity readings.

An environment is idle only when every activity source has been idle for the policy's
time; a source that can't be read counts as active now (an idle stop must never end
work it could not see: a training run whose GPU readings stopped is not idle). The
readings come from environments.selectors.environment_activities; the steps (warn,
stop, back to running) are taken by environments.services.environment_idle_check."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Activity:
    """One source's reading: when it was last active (None: it can't be read) and what
    was read, in words for the timeline."""

    source: str
    last_active_at: datetime | None
    detail: str


class IdleStep(enum.StrEnum):
    ACTIVE = "active"
    WARN = "warn"
    STOP = "stop"


@dataclass(frozen=True)
class IdleDecision:
    step: IdleStep
    idle_since: datetime  # the latest activity of any source (now for one unreadable)
    warn_at: datetime
    stop_at: datetime
    readings: str  # every source's reading, for the timeline and the notification


def idle_decide(
    activities: Sequence[Activity], *, idle_minutes: int, warning_minutes: int, now: datetime
) -> IdleDecision:
    """Whether to warn or stop now. The idle time counts from the latest activity of any
    source; the warning comes `warning_minutes` before the stop."""
    if not activities:
        raise ValueError("an idle decision needs at least one activity source")
    moments = [a.last_active_at for a in activities]
    idle_since = now if any(at is None for at in moments) else max(at for at in moments if at)
    stop_at = idle_since + timedelta(minutes=idle_minutes)
    warn_at = stop_at - timedelta(minutes=warning_minutes)
    if now >= stop_at:
        step = IdleStep.STOP
    elif now >= warn_at:
        step = IdleStep.WARN
    else:
        step = IdleStep.ACTIVE
    readings = "; ".join(f"{a.source}: {a.detail}" for a in activities)
    return IdleDecision(step, min(idle_since, now), warn_at, stop_at, readings)


def last_busy_at(
    series: Sequence[tuple[datetime, float]], *, threshold: float, fresh_after: datetime
) -> datetime | None:
    """From (time, busiest GPU's utilisation %) readings: when the GPUs were last above
    `threshold`, else the first reading (idle since at least then, not since before the
    readings began); None (can't be read, so active) when none is newer than
    `fresh_after`."""
    if not series or max(at for at, _ in series) < fresh_after:
        return None
    busy = [at for at, value in series if value > threshold]
    return max(busy) if busy else min(at for at, _ in series)
