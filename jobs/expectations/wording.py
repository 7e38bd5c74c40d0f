"""How a job's expectation reads on its page and in the jobs list: plain sentences
("expected to start ~14:20 (in 35 min), because …")."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from jobs.expectations.runtime import RuntimePrediction
from jobs.models import Job, WaitKind

# A job its budget paused waits for the budget, not for a start time (billing resumes it).
BUDGET_WAIT = (
    "a budget is used up; it resumes by itself when the budget is raised or a new period starts"
)


def duration_words(seconds: float) -> str:
    """A duration rounded for reading: "under a minute", "35 min", "2 h 5 min", "3 d 4 h"."""
    minutes = round(seconds / 60)
    if minutes < 1:
        return "under a minute"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def moment_words(moment: datetime, now: datetime) -> str:
    """ "~14:20 (in 35 min)", with the date when it is not today (in the current zone)."""
    local, today = timezone.localtime(moment), timezone.localtime(now)
    clock = local.strftime("%H:%M")
    if local.date() != today.date():
        clock = f"{local.strftime('%b')} {local.day}, {clock}"
    left = (moment - now).total_seconds()
    relative = "any moment now" if left < 60 else f"in {duration_words(left)}"
    return f"~{clock} ({relative})"


def waiting_because(job: Job, ahead: int, ahead_higher: int) -> str:
    """Why a queued job waits, in words, from admission's wait kind and message (the
    kind decides; the message only adds its figures)."""
    kind = job.wait_kind
    if kind == WaitKind.SUSPENDED:
        return "your organisation is suspended (its jobs start once it is reactivated)"
    if kind in (WaitKind.QUOTA, WaitKind.QUOTA_QUEUE):
        detail = job.status_reason.removeprefix("quota: ") if kind == WaitKind.QUOTA else ""
        quota = f"your organisation's quota ({detail})" if detail else "your organisation's quota"
        return f"{quota} is taken by its other jobs"
    if kind == WaitKind.FAIR_SHARE:
        return "organisations using less of its pool go first among equal priorities (fair share)"
    if kind in (WaitKind.CAPACITY, WaitKind.TOPOLOGY):
        return job.status_reason or "its pool has no free capacity"
    if ahead:
        jobs = "job is" if ahead == 1 else "jobs are"
        higher = f" ({ahead_higher} of higher priority)" if ahead_higher else ""
        return f"{ahead} {jobs} ahead of it for the same pool{higher}"
    return "it is waiting for admission"


def basis_words(prediction: RuntimePrediction) -> str:
    """What a prediction rests on: "12 similar runs (median 42 min)", or the limit."""
    if prediction.basis == "max_runtime":
        return f"its maximum runtime ({duration_words(prediction.median_seconds)})"
    return (
        f"{prediction.samples} similar runs {prediction.basis_label} "
        f"(median {duration_words(prediction.median_seconds)}, "
        f"90 % within {duration_words(prediction.p90_seconds)})"
    )


def start_sentence(start: datetime | None, because: str, now: datetime) -> str:
    if start is None:
        return f"no start can be foreseen yet, because {because}"
    if (start - now).total_seconds() < 60:
        return f"expected to start any moment now; until then {because}"
    return f"expected to start {moment_words(start, now)}, because {because}"


def end_sentence(end: datetime, prediction: RuntimePrediction, now: datetime) -> str:
    return f"expected to end {moment_words(end, now)}, based on {basis_words(prediction)}"


def start_summary(start: datetime | None, now: datetime) -> str:
    """A list row's short form of `start_sentence`."""
    return "start not foreseeable yet" if start is None else f"starts {moment_words(start, now)}"


def end_summary(end: datetime, now: datetime) -> str:
    return f"ends {moment_words(end, now)}"
