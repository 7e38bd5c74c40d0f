"""Environment writes: create, change, start, stop, delete, and the status sync.

An environment runs as a job: start submits a job built from it (`environment_job_spec`)
through jobs' own launch (admission, dispatch, metering and budgets are the jobs'), stop
cancels that job through jobs' own actions; the home volume stays. `environment_sync` is
the one place that sets an environment's status, from its current job's."""

from __future__ import annotations

import re

from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone

from console.crypto import decrypt_json, encrypt_json
from console.models import SshPublicKey, Tenant, User
from console.selectors import membership_of
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from environments import jupyter, selectors, sshd
from environments.models import Environment, EnvironmentStatus, Interactive
from jobs.actors import SYSTEM, Actor
from jobs.models import Job, JobStatus
from jobs.services import JobSpec, job_cancel, job_submit, spec_validate, tenant_secrets_resolve
from marketplace.models import GpuType, ImageInteractive, Region
from marketplace.selectors import regions_for_tenant
from storage.selectors import volumes_for_tenant
from storage.services import volume_create, volume_delete

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
DEFAULT_HOME_GIB = 10
# An environment runs until stopped (by its user or its idle rule; jobs need a bound).
MAX_RUNTIME_MINUTES = 30 * 24 * 60
IDLE_POLICY_DEFAULTS: dict[str, int | None] = {
    "idle_minutes": 60,  # every activity source idle this long: stop
    "warning_minutes": 10,  # warned this long before the stop
    "gpu_busy_percent": 5,  # GPU utilisation above this is activity
    "delete_after_stopped_days": None,  # None: never deleted for being stopped
}
IDLE_POLICY_BOUNDS = {
    "idle_minutes": (5, 7 * 24 * 60),
    "warning_minutes": (0, 24 * 60),
    "gpu_busy_percent": (0, 100),
    "delete_after_stopped_days": (1, 365),
}
KEEP_ALIVE_MAX_MINUTES = 24 * 60
# Fields a change may set (the name, region and home volume stay).
CHANGEABLE = ("image", "cpus", "gpu_type", "gpus_per_node", "interactive", "volumes", "env",
              "secrets", "idle_policy")  # fmt: skip

# On a cluster, the image marks that serve each kind of environment.
IMAGE_SERVES: dict[str, set[str]] = {
    Interactive.SSH: {ImageInteractive.SSH, ImageInteractive.BOTH},
    Interactive.JUPYTER: {ImageInteractive.JUPYTER, ImageInteractive.BOTH},
    Interactive.BOTH: {ImageInteractive.BOTH},
}

SERVED: dict[str, str] = {
    Interactive.SSH: "sshd",
    Interactive.JUPYTER: "Jupyter",
    Interactive.BOTH: "sshd and Jupyter",
}

_STATUS_OF_JOB = {
    JobStatus.QUEUED: EnvironmentStatus.STARTING,
    JobStatus.DISPATCHING: EnvironmentStatus.STARTING,
    JobStatus.PROVISIONING: EnvironmentStatus.STARTING,
    JobStatus.RESUMING: EnvironmentStatus.STARTING,
    JobStatus.PREEMPTED: EnvironmentStatus.STARTING,  # requeued: it starts again
    JobStatus.RUNNING: EnvironmentStatus.RUNNING,
    JobStatus.PAUSING: EnvironmentStatus.STOPPING,
    JobStatus.CANCELLING: EnvironmentStatus.STOPPING,
    JobStatus.PAUSED: EnvironmentStatus.STOPPED,  # e.g. by its budget: start it again
    JobStatus.SUCCEEDED: EnvironmentStatus.STOPPED,
    JobStatus.CANCELLED: EnvironmentStatus.STOPPED,
    JobStatus.FAILED: EnvironmentStatus.FAILED,
}


def status_for_job(job: Job | None) -> tuple[str, str]:
    """The environment's status and reason while `job` is its current job."""
    if job is None:
        return EnvironmentStatus.STOPPED, ""
    status = _STATUS_OF_JOB[JobStatus(job.status)]
    shown_reason = status in (EnvironmentStatus.FAILED, EnvironmentStatus.STARTING) or (
        job.status == JobStatus.PAUSED
    )
    return status, (job.status_reason or "")[:300] if shown_reason else ""


def environment_sync(*, environment: Environment) -> Environment:
    """Set the environment's status from its current job's (saved only when it changed);
    a running one the idle rule warned about reads as idle_warning."""
    job = environment.current_job
    if job is not None:
        job.refresh_from_db(fields=["status", "status_reason"])
    status, reason = status_for_job(job)
    if status == EnvironmentStatus.RUNNING and environment.idle_stop_at is not None:
        status = EnvironmentStatus.IDLE_WARNING
        reason = f"Idle: stops at {when(environment.idle_stop_at)} unless there is activity."
    if (status, reason) != (environment.status, environment.status_reason):
        environment.status, environment.status_reason = status, reason
        Environment.objects.filter(pk=environment.pk).update(
            status=status, status_reason=reason, updated_at=timezone.now()
        )
    return environment


def when(at) -> str:
    return f"{timezone.localtime(at):%Y-%m-%d %H:%M %Z}"


def idle_policy_validate(policy: object) -> dict:
    """The idle policy with defaults filled in; unknown keys and out-of-range values are
    refused (the rule is environments.idle_rule)."""
    if policy is None:
        policy = {}
    if not isinstance(policy, dict):
        raise ServiceError("The idle policy is an object.", field="idle_policy")
    unknown = sorted(set(policy) - set(IDLE_POLICY_DEFAULTS))
    if unknown:
        raise ServiceError(
            f"Unknown idle policy setting {', '.join(unknown)}; known: "
            f"{', '.join(IDLE_POLICY_DEFAULTS)}.",
            field="idle_policy",
        )
    clean = {**IDLE_POLICY_DEFAULTS, **policy}
    for key, value in clean.items():
        low, high = IDLE_POLICY_BOUNDS[key]
        if value is None and IDLE_POLICY_DEFAULTS[key] is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ServiceError(
                f"Idle policy {key} is a whole number from {low} to {high}.", field="idle_policy"
            )
    if clean["warning_minutes"] >= clean["idle_minutes"]:
        raise ServiceError(
            "The idle warning comes before the stop: warning_minutes < idle_minutes.",
            field="idle_policy",
        )
    return clean


def check_may_use(environment: Environment, user: User | None) -> None:
    if user is None:
        return  # the platform's own actions
    membership = membership_of(user=user, tenant=environment.tenant)
    if not selectors.may_use_environment(membership, environment):
        raise ServiceError(
            "Members use only the environments they created; ask an owner or admin.",
            code=ErrorCode.FORBIDDEN,
        )


def _check_extra_volumes(volumes: object) -> list:
    if not isinstance(volumes, list):
        raise ServiceError(
            'Volumes are a list of {"name", "path", "read_only"} objects.', field="volumes"
        )
    for mount in volumes:
        path = mount.get("path") if isinstance(mount, dict) else None
        if isinstance(path, str) and (path == sshd.HOME_PATH or path.startswith("/workspace/")):
            raise ServiceError(
                f"{sshd.HOME_PATH} is the home volume's; mount other volumes elsewhere.",
                field="volumes",
            )
    return volumes


def _check_env(env: object) -> dict:
    for name in (sshd.HOST_KEY_VARIABLE, jupyter.TOKEN_VARIABLE):
        if isinstance(env, dict) and name in env:
            raise ServiceError(f"{name} is the console's.", field="env")
    return env if isinstance(env, dict) else {}


def environment_job_spec(
    environment: Environment, *, authorized_keys: str, with_home: bool = True
) -> JobSpec:
    """The job one start of the environment runs: sshd (environments.sshd) and/or Jupyter
    (environments.jupyter), the home volume read-write at /workspace, its other volumes,
    env and secrets."""
    home = []
    if with_home:
        home = [{"name": environment.home_volume.name, "path": sshd.HOME_PATH, "read_only": False}]
    host_key = decrypt_json(environment.host_key_encrypted) if environment.pk else ""
    secret_env = {sshd.HOST_KEY_VARIABLE: host_key} if host_key else {}
    ports = []
    if jupyter.has_ssh(environment):
        ports.append({"name": sshd.PORT_NAME, "port": sshd.SSHD_PORT})
    jupyter_arguments = None
    if jupyter.has_jupyter(environment):
        ports.append({"name": jupyter.PORT_NAME, "port": jupyter.JUPYTER_PORT})
        jupyter_arguments = jupyter.server_arguments(
            base_url=jupyter.base_path(environment), root_dir=sshd.HOME_PATH
        )
        if environment.pk:
            secret_env[jupyter.TOKEN_VARIABLE] = jupyter.jupyter_token(environment)
    return JobSpec(
        name=f"environment {environment.name}",
        image=environment.image,
        command=sshd.environment_command(
            authorized_keys=authorized_keys,
            ssh=jupyter.has_ssh(environment),
            jupyter_arguments=jupyter_arguments,
        ),
        gpus_per_node=environment.gpus_per_node,
        gpu_type=environment.gpu_type.slug if environment.gpu_type else None,
        cpus=environment.cpus,
        region=environment.region.slug,
        max_runtime_minutes=MAX_RUNTIME_MINUTES,
        env=dict(environment.env),
        secret_env=secret_env,
        secrets=list(environment.secrets),
        ports=ports,
        volumes=[*home, *environment.volumes],
    )


def _validate(environment: Environment, *, user: User | None) -> None:
    """The environment's spec as a job would be launched from it, home volume aside (it
    may not exist yet): region, resources, image, env, secrets and other volumes. Sets
    the resolved region and GPU type on `environment`."""
    if environment.interactive not in Interactive.values:
        raise ServiceError(
            f"interactive is one of {', '.join(Interactive.values)}.", field="interactive"
        )
    environment.idle_policy = idle_policy_validate(environment.idle_policy)
    spec = environment_job_spec(environment, authorized_keys="", with_home=False)
    organisation_secrets = tenant_secrets_resolve(
        tenant=environment.tenant, user=user, project="", names=spec.secrets
    )
    resolved = spec_validate(
        tenant=environment.tenant, spec=spec, organisation_secrets=organisation_secrets
    )
    environment.volumes = spec.volumes  # normalised
    environment.region, environment.gpu_type = resolved.region, resolved.gpu_type
    regions = selectors.environment_regions(tenant=environment.tenant)
    if not regions.filter(pk=resolved.region.pk).exists():
        raise ServiceError(
            f"Environments can't be reached in {resolved.region.name}: none of its pools "
            "publishes a job's ports to the console's gateways.",
            field="region",
        )
    needs = IMAGE_SERVES[environment.interactive]
    if selectors.region_serves_itself(resolved.region) and resolved.image.interactive not in needs:
        what = SERVED[environment.interactive]
        raise ServiceError(
            f"In {resolved.region.name} the environment runs on a cluster, where its image "
            f"serves {what} itself, and {resolved.image.name} is not marked as doing so: "
            "pick an image marked for it in the catalog.",
            field="image",
        )


def environment_create(
    *,
    tenant: Tenant,
    user: User | None,
    name: str,
    region: str,
    image: str,
    cpus: int | None = None,
    gpu_type: str | None = None,
    gpus_per_node: int = 0,
    interactive: str = Interactive.SSH,
    home_volume: str | None = None,
    home_volume_gib: int = DEFAULT_HOME_GIB,
    volumes: list | None = None,
    env: dict | None = None,
    secrets: list | None = None,
    idle_policy: dict | None = None,
    request: HttpRequest | None = None,
) -> Environment:
    """A new, stopped environment with its host key, and its home volume (made here,
    `<name>-home`, unless one is named)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ServiceError(
            "An environment name is up to 63 lower-case letters, digits and -, starting "
            "and ending with a letter or digit.",
            field="name",
        )
    if Environment.objects.for_tenant(tenant).filter(name=name).exists():
        raise ServiceError(
            f"An environment named {name} exists already.", code=ErrorCode.CONFLICT, field="name"
        )
    environment = Environment(
        tenant=tenant, name=name, created_by=user, image=image, cpus=cpus,
        gpus_per_node=gpus_per_node, interactive=interactive,
        volumes=_check_extra_volumes(volumes or []), env=_check_env(env or {}),
        secrets=secrets or [], idle_policy=idle_policy or {},
    )  # fmt: skip
    environment.region = _region_stub(tenant, region)
    environment.gpu_type = None
    if gpu_type:
        environment.gpu_type = _gpu_stub(gpu_type)
    _validate(environment, user=user)
    made_volume = None
    if home_volume:
        home = volumes_for_tenant(tenant=tenant).filter(name=home_volume).first()
        if home is None:
            raise ServiceError(f"No volume named {home_volume}.", field="home_volume")
        if home.region_id != environment.region.pk:
            raise ServiceError(
                f"Volume {home.name} is in {home.region.slug}; the environment runs in "
                f"{environment.region.slug}.",
                field="home_volume",
            )
    else:
        home = made_volume = volume_create(
            tenant=tenant,
            user=user,
            name=f"{name[:58].rstrip('-')}-home",
            size_gib=home_volume_gib,
            region=environment.region.slug,
            request=request,
        )
    environment.home_volume = home
    private, public = sshd.host_key_generate()
    environment.host_key_encrypted, environment.host_key_public = encrypt_json(private), public
    try:
        with transaction.atomic(durable=True):
            environment.save()
            audit_record(
                action="environment.created", tenant=tenant, actor=user, target=environment,
                request=request, metadata={"name": name, "home_volume": home.name},
            )  # fmt: skip
    except IntegrityError:  # a concurrent create of the same name won
        if made_volume is not None:
            volume_delete(volume=made_volume, user=user, request=request)
        raise ServiceError(
            f"An environment named {name} exists already.", code=ErrorCode.CONFLICT, field="name"
        ) from None
    return environment


def _region_stub(tenant: Tenant, slug: str) -> Region:
    region = regions_for_tenant(tenant).filter(slug=slug).first()
    if region is None:
        raise ServiceError(f"Unknown region “{slug}”.", field="region")
    return region


def _gpu_stub(slug: str) -> GpuType:
    gpu = GpuType.objects.filter(slug=slug).first()
    if gpu is None:
        raise ServiceError(f"Unknown GPU type “{slug}”.", field="gpu_type")
    return gpu


def environment_update(
    *, environment: Environment, user: User | None, changes: dict, request=None
) -> Environment:
    """Change the spec; it applies from the next start."""
    check_may_use(environment, user)
    unknown = sorted(set(changes) - set(CHANGEABLE))
    if unknown:
        raise ServiceError(f"{', '.join(unknown)} can't be changed.", field=unknown[0])
    with transaction.atomic(durable=True):
        environment = Environment.objects.select_for_update().get(pk=environment.pk)
        for key, value in changes.items():
            if key == "gpu_type":
                environment.gpu_type = _gpu_stub(value) if value else None
            elif key == "volumes":
                environment.volumes = _check_extra_volumes(value)
            elif key == "env":
                environment.env = _check_env(value)
            else:
                setattr(environment, key, value)
        _validate(environment, user=user)
        if "idle_policy" in changes:
            environment.deletion_noticed_at = None  # a new date is told anew
        environment.save()
        audit_record(
            action="environment.changed", tenant=environment.tenant, actor=user,
            target=environment, request=request, metadata={"fields": sorted(changes)},
        )  # fmt: skip
    return environment


def environment_start(
    *, environment: Environment, user: User | None, request: HttpRequest | None = None
) -> Environment:
    """Start the environment: a new job runs its sshd with the keys of the members who
    may use it. 409 when it runs already or its home volume is held read-write by a
    job that isn't finished."""
    check_may_use(environment, user)
    with transaction.atomic():
        environment = (
            Environment.objects.select_for_update(of=("self",))
            .select_related("tenant", "region", "gpu_type", "home_volume", "current_job")
            .get(pk=environment.pk)
        )
        environment_sync(environment=environment)
        if environment.active:
            raise ServiceError(
                f"Environment {environment.name} is {environment.get_status_display().lower()}"
                " already.",
                code=ErrorCode.CONFLICT,
            )
        authorized_keys = selectors.authorized_keys_text(environment=environment)
        if not authorized_keys and environment.interactive == Interactive.SSH:
            raise ServiceError(
                "Nobody who may use this environment has an SSH public key: add yours "
                "under Account → SSH keys, then start it."
            )
        previous = environment.current_job
        if previous is not None and previous.status == JobStatus.PAUSED:
            # Paused (e.g. by its budget) it still holds the home volume: it ends here.
            job_cancel(job=previous, actor=SYSTEM, reason="its environment started again")
        spec = environment_job_spec(environment, authorized_keys=authorized_keys)
        job = job_submit(tenant=environment.tenant, user=user, spec=spec, request=request)
        environment.current_job = job
        environment.idle_stop_at = environment.keep_alive_until = None
        environment.deletion_noticed_at = None  # a start keeps it: counted from the next stop
        environment.save(
            update_fields=["current_job", "idle_stop_at", "keep_alive_until",
                           "deletion_noticed_at", "updated_at"]
        )  # fmt: skip
        environment_sync(environment=environment)
        audit_record(
            action="environment.started", tenant=environment.tenant, actor=user,
            target=environment, request=request, metadata={"job": job.pk},
        )  # fmt: skip
    return environment


def environment_stop(
    *,
    environment: Environment,
    user: User | None,
    request: HttpRequest | None = None,
    reason: str = "its environment was stopped",
) -> Environment:
    """Stop the environment's job (its home volume stays); 409 when it is stopped."""
    check_may_use(environment, user)
    with transaction.atomic():
        environment = (
            Environment.objects.select_for_update(of=("self",))
            .select_related("tenant", "current_job")
            .get(pk=environment.pk)
        )
        environment_sync(environment=environment)
        job = environment.current_job
        if not environment.active or job is None:
            raise ServiceError(
                f"Environment {environment.name} is {environment.get_status_display().lower()}"
                " already.",
                code=ErrorCode.CONFLICT,
            )
        actor = Actor.of_user(user) if user else SYSTEM
        job_cancel(job=job, actor=actor, reason=reason)
        Environment.objects.filter(pk=environment.pk).update(idle_stop_at=None)
        environment.idle_stop_at = None
        environment_sync(environment=environment)
        audit_record(
            action="environment.stopped", tenant=environment.tenant, actor=user,
            target=environment, request=request, metadata={"job": job.pk, "reason": reason},
        )  # fmt: skip
    return environment


def environment_delete(
    *,
    environment: Environment,
    user: User | None,
    keep_volume: bool,
    request: HttpRequest | None = None,
) -> None:
    """Delete a stopped environment (409 while it runs), and its home volume unless
    `keep_volume` (409, and nothing deleted, while another job or a service's replicas
    hold the volume)."""
    check_may_use(environment, user)
    environment_sync(environment=environment)
    if environment.active:
        raise ServiceError(
            f"Stop environment {environment.name} before deleting it.", code=ErrorCode.CONFLICT
        )
    job = environment.current_job
    if job is not None and job.status == JobStatus.PAUSED:
        job_cancel(job=job, actor=SYSTEM, reason="its environment was deleted")
    if not keep_volume:
        volume_delete(volume=environment.home_volume, user=user, request=request)
    with transaction.atomic(durable=True):
        audit_record(
            action="environment.deleted", tenant=environment.tenant, actor=user,
            target=environment, request=request,
            metadata={"name": environment.name, "home_volume_kept": keep_volume},
        )  # fmt: skip
        environment.delete()


def environment_connected(
    *, environment_id: int, user_id: int, fingerprint: str
) -> tuple[str, int] | None:
    """The SSH gateway opens a connection for `user_id` (signed in with the key of
    `fingerprint`): where the environment's sshd is (None: not running, or the user may
    no longer use it), recorded as activity."""
    environment = (
        Environment.objects.select_related("tenant", "current_job").filter(pk=environment_id)
    ).first()
    if environment is None:
        return None
    user = User.objects.filter(pk=user_id, is_active=True).first()
    membership = membership_of(user=user, tenant=environment.tenant) if user else None
    if not selectors.may_use_environment(membership, environment):
        return None
    target = selectors.environment_port_address(environment=environment)
    if target is not None:
        now = timezone.now()
        Environment.objects.filter(pk=environment.pk).update(last_activity_at=now)
        SshPublicKey.objects.filter(user_id=user_id, fingerprint=fingerprint).update(
            last_used_at=now
        )
    return target
