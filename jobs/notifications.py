"""Tell a job's owner when it ends, fails or is preempted (in-app, and e-mail)."""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse

from console.services.notifications import notify
from jobs.actors import Actor
from jobs.models import JobStatus

NOTIFY = {
    JobStatus.SUCCEEDED: ("success", "{name} succeeded"),
    JobStatus.FAILED: ("error", "{name} failed"),
    JobStatus.PREEMPTED: ("warning", "{name} was preempted"),
    JobStatus.CANCELLING: ("warning", "{name} was cancelled"),
    JobStatus.CANCELLED: ("warning", "{name} was cancelled"),
    JobStatus.PAUSED: ("warning", "{name} was paused"),
}
# Changes a person made themselves need no message; only the system's, backend's or
# budget's do (a cancel by a colleague is still told).
QUIET_ACTORS_FOR = {JobStatus.CANCELLING, JobStatus.CANCELLED, JobStatus.PAUSED}


def job_status_notify(job, to: str, actor: Actor, reason: str, *, previous: str = "") -> None:
    if to not in NOTIFY or job.created_by is None:
        return
    if to == JobStatus.CANCELLED and previous == JobStatus.CANCELLING:
        return  # told when the cancel was asked (by whom), not again when the work ended
    if to in QUIET_ACTORS_FOR and actor.user_id == job.created_by_id:
        return
    if to == JobStatus.PAUSED and not job.paused_by_budget:
        return
    level, title = NOTIFY[to]
    path = reverse("jobs:detail", args=[job.pk])
    notify(
        tenant=job.tenant,
        user=job.created_by,
        title=title.format(name=job.name),
        body=f"Job #{job.pk} “{job.name}”: {reason or to}.",
        url=path,
        level=level,
        email=settings.JOB_NOTIFICATION_EMAILS,
    )


def job_repair_notify(job, what: str, reason: str) -> None:
    """Tell the job's owner that self-repair acted on it (paused it, moved it off a
    node), with the rule and the readings."""
    if job.created_by is None:
        return
    notify(
        tenant=job.tenant,
        user=job.created_by,
        title=f"{job.name} {what}",
        body=f"Job #{job.pk} “{job.name}”: {reason}.",
        url=reverse("jobs:detail", args=[job.pk]),
        level="warning",
        email=settings.JOB_NOTIFICATION_EMAILS,
    )
