"""Writes for jobs, one module per concern:

- `spec`: what a launch asks for and its validation against the catalog;
- `placement`: which acceptable region and GPU type a launch runs in (price, locality);
- `launch`: recording a launch (policies, secrets, admission) and clones;
- `admission`: which queued jobs take compute, and what the others wait for;
- `preemption`: which lower-priority jobs a job that can't fit stops, and stopping them;
- `fair_share`, `topology`: the order among organisations, and gangs kept in one block;
- `dispatch`: starting admitted attempts on their backend (the sweep task);
- `files`: what finished jobs left on the host;
- `checkpoints`: where a later start resumes from, and pruning old checkpoints;
- `actions`: pause, resume, cancel, delete;
- `observe`: backend observations, max runtime, grace, the reconciler;
- `secrets`, `templates`: organisation secrets and launch templates.

Status changes go through jobs.state only; backend calls happen in tasks after commit.
Callers import from here.
"""

from jobs.services.actions import (
    ActionRefused,
    job_cancel,
    job_delete,
    job_pause,
    job_pause_once,
    job_resume,
)
from jobs.services.admission import jobs_admit
from jobs.services.checkpoints import (
    job_checkpoint_credentials,
    job_checkpoint_event,
    job_checkpoint_record,
    job_checkpoints_prune,
    job_resume_prepare,
    jobs_checkpoints_prune,
)
from jobs.services.dispatch import (
    job_backend_resume,
    job_dispatch,
    jobs_dispatch,
    jobs_dispatch_pending,
)
from jobs.services.files import job_files_discard, jobs_files_prune
from jobs.services.launch import job_clone, job_submit, priority_allowed_check
from jobs.services.observe import job_apply_observation, jobs_observe, jobs_reconcile
from jobs.services.preemption import job_preempted_stop
from jobs.services.secrets import tenant_secret_delete, tenant_secret_set, tenant_secrets_resolve
from jobs.services.spec import (
    JobSpec,
    ResolvedSpec,
    spec_from_job,
    spec_validate,
)
from jobs.services.templates import (
    TEMPLATE_FIELDS,
    launch_template_delete,
    launch_template_save,
    spec_from_template,
)

__all__ = [
    "TEMPLATE_FIELDS",
    "ActionRefused",
    "JobSpec",
    "ResolvedSpec",
    "job_apply_observation",
    "job_backend_resume",
    "job_cancel",
    "job_checkpoint_credentials",
    "job_checkpoint_event",
    "job_checkpoint_record",
    "job_checkpoints_prune",
    "job_clone",
    "job_delete",
    "job_dispatch",
    "job_files_discard",
    "job_pause",
    "job_pause_once",
    "job_preempted_stop",
    "job_resume",
    "job_resume_prepare",
    "job_submit",
    "jobs_admit",
    "jobs_checkpoints_prune",
    "jobs_dispatch",
    "jobs_dispatch_pending",
    "jobs_files_prune",
    "jobs_observe",
    "jobs_reconcile",
    "launch_template_delete",
    "launch_template_save",
    "priority_allowed_check",
    "spec_from_job",
    "spec_from_template",
    "spec_validate",
    "tenant_secret_delete",
    "tenant_secret_set",
    "tenant_secrets_resolve",
]
