"""Launch: validate a spec, ask the launch policies, record the job and admit it.
One transaction; dispatch is queued after commit."""

from __future__ import annotations

from decimal import Decimal

from django.db import IntegrityError, transaction

from console.crypto import encrypt_json
from console.models import Tenant, User
from console.permissions import Capability, has_capability
from console.selectors import membership_of
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from console.tenant_admin import TenantSuspended
from jobs.actors import SYSTEM, Actor
from jobs.checkpoints.store import checkpoint_store
from jobs.extensions import launch_check, volume_provider
from jobs.models import Job, JobStatus, LaunchTemplate, Priority, WaitKind
from jobs.services.admission import job_pools, jobs_admit
from jobs.services.checkpoints import job_store_prefix
from jobs.services.secrets import secrets_named_again, tenant_secrets_resolve
from jobs.services.spec import JobSpec, spec_from_job, spec_validate, validate_env
from jobs.state import job_note


def job_submit(
    *,
    tenant: Tenant,
    user: User | None,
    spec: JobSpec,
    idempotency_key: str | None = None,
    request=None,
    launch_template: LaunchTemplate | None = None,
    checkpoint_source: Job | None = None,
) -> Job:
    """Validate and record a launch; it is admitted now if it fits, else it queues.
    `launch_template`: the tenant's template it was launched from (its runs predict
    this one's runtime). `checkpoint_source`: a job of the same tenant whose latest
    checkpoint the first start continues from."""
    if launch_template is not None and launch_template.tenant_id != tenant.pk:
        raise ServiceError("No such launch template.", field="template")
    if idempotency_key:
        existing = Job.objects.for_tenant(tenant).filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
    # Resolved first: the secrets' values count toward the environment's bounds.
    resolved_secrets = tenant_secrets_resolve(
        tenant=tenant, user=user, project=spec.project, names=spec.secrets
    )
    resolved = spec_validate(tenant=tenant, spec=spec, organisation_secrets=resolved_secrets)
    priority_allowed_check(tenant=tenant, user=user, priority=spec.priority)
    launch_check(tenant=tenant, spec=spec)
    placement = resolved.placement
    secret_env = {**resolved_secrets, **spec.secret_env}
    try:
        with transaction.atomic():
            job = Job.objects.create(
                tenant=tenant,
                created_by=user,
                name=spec.name.strip(),
                project=spec.project,
                labels=spec.labels,
                image=resolved.image,
                image_reference=resolved.image.reference,
                command=spec.command,
                env=validate_env(spec.env, "env"),
                secret_env_encrypted=encrypt_json(secret_env) if secret_env else "",
                secret_env_names=sorted(secret_env),
                gpu_type=resolved.gpu_type,
                gpus_per_node=spec.gpus_per_node,
                cpus=resolved.cpus,
                nodes=spec.nodes,
                region=resolved.region,
                spot_ratio=Decimal(spec.spot_ratio),
                priority=spec.priority,
                max_runtime_minutes=spec.max_runtime_minutes,
                checkpoint_path=spec.checkpoint_path,
                checkpoint_keep_last=spec.checkpoint_keep_last,
                gpu_memory_gib=spec.gpu_memory_gib,
                auto_release=spec.auto_release,
                ports=spec.ports,
                requirements=resolved.requirements,
                backend=placement.backend,
                pool=placement.pool,
                spot_pool=placement.spot_pool,
                spot_nodes=placement.spot_nodes,
                on_demand_nodes=placement.on_demand_nodes,
                status=JobStatus.QUEUED,
                status_reason="waiting for admission",
                wait_kind=WaitKind.ADMISSION,
                idempotency_key=idempotency_key or "",
                launch_template=launch_template,
                checkpoint_source=checkpoint_source,
            )
            volume_provider().attach(job=job, mounts=spec.volumes)
            job_note(job=job, actor=Actor.of_user(user) if user else SYSTEM, reason="submitted")
            if resolved.choice.was_a_choice:  # the platform picked where: say how
                job_note(job=job, actor=SYSTEM, reason=resolved.choice.timeline_note())
            audit_record(
                action="job.launched",
                tenant=tenant,
                actor=user,
                target=job,
                request=request,
                metadata={"gpus": job.total_gpus, "nodes": job.nodes, "image": job.image_reference},
            )
            jobs_admit(pools=job_pools(job), launched=job)
    except IntegrityError:
        existing = Job.objects.for_tenant(tenant).filter(idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return existing
    return job  # admission changed this instance as it changed the row


class SuspensionLaunchPolicy:
    """jobs.extensions.LaunchPolicy: a suspended organisation launches nothing (403)."""

    def check_launch(self, *, tenant: Tenant, spec: JobSpec) -> None:
        # The tenant as this request loaded it: admission re-reads it under its locks, so
        # a suspension that lands meanwhile still holds the job back.
        if tenant.suspended_at is not None:
            raise TenantSuspended(tenant.suspension_reason)


def priority_allowed_check(*, tenant: Tenant, user: User | None, priority: str) -> None:
    """`critical` skips budget pauses and outranks the organisation's other jobs: only a
    role with LAUNCH_CRITICAL (owners, admins) may ask for it, for a job or a service.
    The platform's own launches (no user) are not limited."""
    if priority != Priority.CRITICAL or user is None:
        return
    membership = membership_of(user=user, tenant=tenant)
    if not has_capability(membership, Capability.LAUNCH_CRITICAL):
        raise ServiceError(
            "Only owners and admins may ask for priority critical; choose normal or low.",
            code=ErrorCode.FORBIDDEN,
            field="priority",
        )


def job_clone(*, job: Job, user: User | None, request=None, from_checkpoint: bool = False) -> Job:
    """A new job with `job`'s spec; `from_checkpoint`: its first start continues from
    `job`'s latest complete checkpoint (409 when there is none)."""
    if from_checkpoint and checkpoint_store().latest(job_store_prefix(job)) is None:
        raise ServiceError(
            "This job has no complete checkpoint to continue from.", code=ErrorCode.CONFLICT
        )
    spec = spec_from_job(job)
    spec.name = f"{job.name} (clone)"[:100]
    # Organisation secrets are named again, not copied: the clone is checked like a launch.
    spec = secrets_named_again(tenant=job.tenant, spec=spec)
    # The same kind of run as its source: its template's runs predict it too.
    return job_submit(
        tenant=job.tenant,
        user=user,
        spec=spec,
        request=request,
        launch_template=job.launch_template,
        checkpoint_source=job if from_checkpoint else None,
    )
