"""Moving test jobs through the state machine (jobs.state), the only way tests change a
job's status: never by writing Job.status or JobEvent rows."""

from __future__ import annotations

from collections import deque
from contextlib import nullcontext
from datetime import datetime
from unittest.mock import patch

from jobs.actors import BACKEND, Actor
from jobs.backends import get_backend
from jobs.models import Job, JobStatus
from jobs.services import JobSpec, job_dispatch, job_submit
from jobs.state import TRANSITIONS, job_transition


def legal_path(current: str, to: str) -> list[str]:
    """The shortest chain of legal transitions from `current` to `to` (excluding current)."""
    previous: dict[str, str | None] = {current: None}
    queue = deque([current])
    while queue:
        status = queue.popleft()
        if status == to and status != current:
            break
        for nxt in sorted(TRANSITIONS[status]):
            if nxt not in previous:
                previous[nxt] = status
                queue.append(nxt)
    if to not in previous or to == current:
        raise ValueError(f"no legal path from {current!r} to {to!r}")
    path = [to]
    while previous[path[-1]] != current:
        path.append(previous[path[-1]])  # type: ignore[arg-type]
    return path[::-1]


def at_time(at: datetime | None):
    """Run the block as if the clock said `at` (None: the real clock). jobs.state and
    the launch services stamp their rows and events with timezone.now(): patching it is
    how a test places a launch or a transition in the past without writing events."""
    return patch("django.utils.timezone.now", return_value=at) if at else nullcontext()


def advance(
    job: Job, *statuses: str, actor: Actor = BACKEND, at: datetime | None = None, **changes
) -> Job:
    """Apply each status in turn (each must be legal from the one before); `changes` go
    with the first step (e.g. attempt=2 on requeue). Returns `job`, refreshed."""
    with at_time(at):
        for status in statuses:
            job_transition(job=job, to=status, actor=actor, **changes)
            changes = {}
    job.refresh_from_db()
    return job


def advance_to(
    job: Job, to: str, *, actor: Actor = BACKEND, at: datetime | None = None, **changes
) -> Job:
    """Reach `to` by the shortest legal path (e.g. queued → dispatching → running), all
    steps at the same time `at`."""
    job.refresh_from_db(fields=["status"])
    return advance(job, *legal_path(job.status, to), actor=actor, at=at, **changes)


def submit(world, name: str = "job", *, user=None, **spec) -> Job:
    """Submit through the real service (job_submit, admission included) as `world`'s
    member: a CPU job on python-3.11 unless `spec` says otherwise (a GPU job defaults to
    the CUDA runtime image)."""
    values = {"image": "python-3.11", "command": ["python", "-c", "pass"], "cpus": 1}
    if spec.get("gpu_type"):
        values["image"] = "cuda-12-4-runtime"
    values.update(spec)
    # Priority critical is for owners and admins (a member's is refused).
    default_user = world.admin if values.get("priority") == "critical" else world.member
    return job_submit(
        tenant=world.tenant, user=user or default_user, spec=JobSpec(name=name, **values)
    )


def launch(world, spec: JobSpec) -> Job:
    """Submit `spec` as `world`'s member and dispatch it as the dispatch task would, through
    the real services. It must be admitted at once, and its backend must accept the
    attempt: running where work starts at once (a process), provisioning where pods still
    have to be scheduled."""
    job = job_submit(tenant=world.tenant, user=world.member, spec=spec)
    assert job.status == JobStatus.DISPATCHING, job.status_reason
    job = job_dispatch(job=job)
    accepted = (
        JobStatus.RUNNING if get_backend(job.backend).starts_immediately else JobStatus.PROVISIONING
    )
    assert job.status == accepted, job.status_reason
    return job
