"""What people (and the budget and alert rules) do to a job: pause, resume, cancel,
delete. Each is a state-machine transition; the backend call follows in a task."""

from __future__ import annotations

from django.db import transaction

from console.models import Tenant, User
from console.queueing import enqueue_on_commit
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from jobs import tasks
from jobs.actors import SUSPENSION, Actor, ActorKind
from jobs.extensions import job_deleting, launch_check
from jobs.models import FINISHED, ON_BACKEND, PAUSABLE, Job, JobStatus
from jobs.services.admission import (
    blocking_wait,
    held_usage,
    job_pools,
    jobs_admit,
    locked_admission_state,
)
from jobs.services.spec import spec_from_job
from jobs.services.topology import Blocks
from jobs.state import job_transition


class ActionRefused(ServiceError):
    def __init__(self, message: str):
        super().__init__(message, code=ErrorCode.CONFLICT)


def job_pause(*, job: Job, actor: Actor, reason: str = "paused by user") -> Job:
    """Pause a running job; repeating is a no-op."""
    job_pause_once(job=job, actor=actor, reason=reason)
    job.refresh_from_db()
    return job


def job_pause_once(*, job: Job, actor: Actor, reason: str) -> bool:
    """Pause a running job; True only when this call made the pause, so automated
    callers (budgets, alert rules) record only the pauses they made. A budget's pause is
    marked, so raising the budget resumes exactly those jobs."""
    job.refresh_from_db()
    if job.status in (JobStatus.PAUSING, JobStatus.PAUSED):
        return False
    if job.status not in PAUSABLE:
        raise ActionRefused(f"Only a running job can be paused; this one is {job.status}.")
    with transaction.atomic():
        job_transition(
            job=job,
            to=JobStatus.PAUSING,
            actor=actor,
            reason=reason,
            expected_from=PAUSABLE,
            paused_by_budget=actor.kind == ActorKind.BUDGET,
        )
        enqueue_on_commit(tasks.job_suspend_task, job.pk)
    return True


def job_resume(*, job: Job, actor: Actor, reason: str = "resumed by user") -> Job:
    """Resume a paused job. It takes compute (and is billed) again, so the launch
    policies judge it as they judge a launch: a used-up budget refuses it (402, naming
    the budget), as does a suspended organisation (403); then it must fit, like an
    admission."""
    job.refresh_from_db()
    if job.status in (JobStatus.RESUMING, JobStatus.RUNNING, JobStatus.PROVISIONING):
        return job
    if job.status != JobStatus.PAUSED:
        raise ActionRefused(f"Only a paused job can be resumed; this one is {job.status}.")
    # job.tenant is read afresh (refresh_from_db drops the cached row): a suspension
    # that landed since the job was loaded refuses the resume.
    launch_check(tenant=job.tenant, spec=spec_from_job(job))
    with transaction.atomic():
        # A paused job released its compute: it must fit again, like a new admission.
        pools, quotas = locked_admission_state(job)
        usage = held_usage(pool_ids=list(pools), tenant_ids=[job.tenant_id])
        wait = blocking_wait(job, pools, usage, quotas)
        why = wait.message if wait else Blocks(pools).place(job)
        if why:
            raise ActionRefused(
                f"Not enough free capacity to resume now ({why}); try again when other jobs finish."
            )
        job = job_transition(
            job=job, to=JobStatus.RESUMING, actor=actor, reason=reason, paused_by_budget=False
        )
        enqueue_on_commit(tasks.job_resume_task, job.pk)
    return job


def jobs_pause_for_suspension(*, tenant: Tenant, reason: str) -> list[Job]:
    """Pause the organisation's running (and provisioning) jobs because staff suspended
    it; returns those this call paused. Queued jobs wait (admission skips a suspended
    organisation); jobs already starting are paused when the suspension is repeated."""
    paused = []
    for job in Job.objects.for_tenant(tenant).filter(status__in=PAUSABLE):
        try:
            if not job_pause_once(
                job=job, actor=SUSPENSION, reason=f"organisation suspended: {reason}"
            ):
                continue  # paused already
        except ServiceError:
            continue  # it finished or changed meanwhile
        paused.append(job)
        audit_record(
            action="job.paused_by_suspension",
            tenant=tenant,
            actor_label=SUSPENSION.label,
            target=job,
            metadata={"reason": reason},
        )
    # Its queued jobs now wait for the suspension to end (and show why).
    jobs_admit()
    return paused


def job_cancel(*, job: Job, actor: Actor, reason: str = "cancelled by user") -> Job:
    """Stop a job for good; repeating is a no-op. A job whose work may be running on its
    backend becomes `cancelling`: it holds its compute and is billed until the watcher
    sees the work end (a process may take its grace period to stop, pods to terminate),
    then `cancelled`. Any other (queued, dispatching, paused, preempted) is cancelled at
    once and its compute freed."""
    with transaction.atomic():
        # The row's status decides where the cancel goes: read it under the lock the
        # transition takes, so a job that started meanwhile goes through `cancelling`.
        status = Job.objects.select_for_update().values_list("status", flat=True).get(pk=job.pk)
        if status in (JobStatus.CANCELLED, JobStatus.CANCELLING):
            job.refresh_from_db()
            return job
        if status in FINISHED:
            raise ActionRefused(f"The job has already {status}.")
        to = JobStatus.CANCELLING if status in ON_BACKEND else JobStatus.CANCELLED
        job = job_transition(job=job, to=to, actor=actor, reason=reason)
        enqueue_on_commit(tasks.job_cancel_task, job.pk)
        if to == JobStatus.CANCELLED:
            jobs_admit(pools=job_pools(job))
    return job


def job_delete(*, job: Job, user: User | None, request=None) -> None:
    if not job.is_finished:
        raise ActionRefused("Only a finished job can be deleted; cancel it first.")
    with transaction.atomic():
        # Listeners keep what they derived from the job (billing: its usage rollups).
        job_deleting.send(sender=Job, job_ids=[job.pk])
        audit_record(
            action="job.deleted", tenant=job.tenant, actor=user, target=job, request=request
        )
        job.delete()
