"""Reads of environments, always through the tenant scope, and who may use one.

`may_use_environment` is the one rule of access: a member who may launch jobs uses the
environments they created; owners and admins (who act on others' jobs) use any. The
SSH gateway asks it again on every connection, so a removed member (or one whose role
changed) is refused at once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from console.models import Membership, SshPublicKey, Tenant, User
from console.permissions import Capability, has_capability
from console.selectors import membership_of, ssh_keys_for_users
from environments import idle_check, jupyter, sshd
from environments.idle_rule import Activity, last_busy_at
from environments.models import Environment
from jobs.backends import get_backend
from jobs.models import JobMetricSample, JobStatus
from marketplace.models import Backend, Region
from marketplace.selectors import regions_for_tenant

# GPU readings older than this can't tell whether the GPUs work: counted as active.
GPU_READINGS_STALE = timedelta(minutes=5)


def environments_for_tenant(*, tenant: Tenant | None) -> QuerySet[Environment]:
    return Environment.objects.for_tenant(tenant).select_related(
        "region", "gpu_type", "home_volume", "current_job", "created_by"
    )


# Backends that publish a job's ports to the console (`port_address`): on the console's
# host through its loopback, on a cluster at the pod's IP (its NetworkPolicy admits the
# console's gateways). Elsewhere an environment would run, and bill, with no way in.
REACHABLE_BACKENDS = (Backend.LOCAL, Backend.KUBERNETES)


def environment_regions(*, tenant: Tenant) -> QuerySet[Region]:
    """The tenant's regions an environment may run in."""
    return regions_for_tenant(tenant).filter(pools__backend__in=REACHABLE_BACKENDS).distinct()


def region_serves_itself(region: Region) -> bool:
    """Whether an environment in `region` runs where its image must serve SSH and
    Jupyter itself (a cluster), rather than on the console's host, where the console
    provides both inside the job's sandbox."""
    return not region.pools.filter(backend=Backend.LOCAL, is_active=True).exists()


def may_use_environment(membership: Membership | None, environment: Environment) -> bool:
    """May this membership start, stop, change, delete and SSH into `environment`?"""
    if membership is None or membership.tenant_id != environment.tenant_id:
        return False
    if not has_capability(membership, Capability.LAUNCH_JOBS):
        return False
    return membership.user_id == environment.created_by_id or has_capability(
        membership, Capability.ACT_ON_OTHERS_JOBS
    )


def environment_users(*, environment: Environment) -> list[User]:
    """The tenant's members who may use the environment now."""
    memberships = Membership.objects.for_tenant(environment.tenant).select_related("user")
    return [m.user for m in memberships if may_use_environment(m, environment)]


def environment_keys(*, environment: Environment) -> QuerySet[SshPublicKey]:
    """The keys that open the environment now: those of its users with active accounts."""
    users = environment_users(environment=environment)
    return SshPublicKey.objects.filter(user__in=users, user__is_active=True)


def authorized_keys_text(*, environment: Environment) -> str:
    """The job's authorized_keys (console.selectors' lines, which name each key's owner)."""
    lines = ssh_keys_for_users(users=environment_users(environment=environment))
    return "".join(f"{line}\n" for line in lines)


def ssh_login(environment: Environment) -> str:
    """The user name the SSH gateway routes by: `<environment>.<organisation slug>`."""
    return f"{environment.name}.{environment.tenant.slug}"


def gateway_address() -> str:
    """host[:port] that laptops dial for the SSH gateway."""
    if settings.SSH_GATEWAY_PUBLIC_ADDRESS:
        return settings.SSH_GATEWAY_PUBLIC_ADDRESS
    return f"{settings.SSH_GATEWAY_HOST}:{settings.SSH_GATEWAY_PORT}"


def ssh_command(environment: Environment) -> str:
    """The line to paste: OpenSSH jumps through the console's gateway to the
    environment's own sshd (end to end, so scp, sftp and IDEs work as usual)."""
    login = ssh_login(environment)
    return f"ssh -J {login}@{gateway_address()} {sshd.SSH_USER}@{login}"


def ssh_config_snippet(environment: Environment) -> str:
    login = ssh_login(environment)
    return f"Host {login}\n    User {sshd.SSH_USER}\n    ProxyJump {login}@{gateway_address()}\n"


def known_hosts_line(environment: Environment) -> str:
    """The environment's host key as ~/.ssh/known_hosts holds it (stable across starts)."""
    key_type, blob = environment.host_key_public.split()[:2]
    return f"{ssh_login(environment)} {key_type} {blob}"


def host_key_fingerprint(environment: Environment) -> str:
    return sshd.public_key_fingerprint(environment.host_key_public)


def environment_port_address(
    *, environment: Environment, port: int = sshd.SSHD_PORT
) -> tuple[str, int] | None:
    """Where the console reaches one of the environment's ports (its sshd's unless told)
    now: its job runs and its backend publishes the port; else None."""
    job = environment.current_job
    if job is None or job.status != JobStatus.RUNNING:
        return None
    return get_backend(job.backend).port_address(job, port)


def may_open_jupyter(user: User, environment: Environment) -> bool:
    """Its Jupyter opens for its creator alone (while they may use it): its pages come
    from the job and run in the console's origin, with the session of whoever opens them,
    so nobody opens what another person's job serves (an admin included; they can still
    start, stop and SSH into it)."""
    return jupyter.has_jupyter(environment) and environment.created_by_id == user.pk


def jupyter_environment(*, user: User, tenant_slug: str, name: str) -> Environment | None:
    """The environment whose Jupyter `user` opens at /env/<tenant_slug>/<name>/: one with
    Jupyter that they created and may use; None for anything else (the gateway's 404,
    alike for an organisation, environment or access that doesn't exist)."""
    if not user.is_authenticated:
        return None
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        return None
    environment = (
        environments_for_tenant(tenant=tenant).filter(name=name).select_related("tenant").first()
    )
    if environment is None or not may_open_jupyter(user, environment):
        return None
    membership = membership_of(user=user, tenant=tenant)
    return environment if may_use_environment(membership, environment) else None


def jupyter_url(environment: Environment) -> str:
    """The page the Open Jupyter button opens (the notebook's file tree); "" without
    Jupyter."""
    return f"{jupyter.base_path(environment)}tree" if jupyter.has_jupyter(environment) else ""


@dataclass(frozen=True)
class GatewayRoute:
    """What one gateway connection may reach: an environment, and the fingerprints of
    the keys that open it (by user)."""

    environment_id: int
    keys: dict[str, int]


def gateway_route(*, login: str) -> GatewayRoute | None:
    """The environment a gateway login (`<environment>.<organisation>`) names and the
    keys that may open it; None for a login that names nothing (told apart from a wrong
    key by nobody: the gateway refuses both alike)."""
    name, _, slug = login.partition(".")
    if not name or not slug:
        return None
    tenant = Tenant.objects.filter(slug=slug).first()
    environment = (
        Environment.objects.for_tenant(tenant).filter(name=name).select_related("tenant").first()
    )
    if environment is None:
        return None
    keys = dict(environment_keys(environment=environment).values_list("fingerprint", "user_id"))
    return GatewayRoute(environment_id=environment.pk, keys=keys)


def _at(moment: datetime) -> str:
    return f"{timezone.localtime(moment):%H:%M:%S %Z}"


def environment_activities(
    *, environment: Environment, policy: dict, now: datetime
) -> list[Activity]:
    """Every activity source of a running environment, read now, for the idle rule:
    its start, SSH connections through the gateway (kept fresh while one is open),
    "keep running", Jupyter's kernels (where it runs Jupyter: environments.jupyter), for
    GPU environments the busiest GPU's utilisation, and last, given the others' readings,
    the staff's own check where one is set (environments.idle_check)."""
    job = environment.current_job
    assert job is not None
    started = job.running_since or job.status_changed_at
    sources = [Activity("start", started, f"running since {_at(started)}")]
    ssh = environment.last_activity_at
    if ssh is not None and ssh > started:
        sources.append(Activity("ssh", ssh, f"last connection open at {_at(ssh)}"))
    else:
        sources.append(Activity("ssh", started, "no connection since the start"))
    if environment.keep_alive_until is not None and environment.keep_alive_until > started:
        until = environment.keep_alive_until
        sources.append(Activity("keep running", until, f"asked until {_at(until)}"))
    if jupyter.has_jupyter(environment):
        address = environment_port_address(environment=environment, port=jupyter.JUPYTER_PORT)
        if address is None:
            sources.append(Activity("jupyter", None, "not reachable: counted as active"))
        else:
            sources.append(
                Activity("jupyter", *jupyter.activity(environment, address, since=started, now=now))
            )
    if environment.gpus_per_node:
        window_start = now - timedelta(minutes=policy["idle_minutes"] + 1)
        busiest: dict[datetime, float] = {}
        samples = JobMetricSample.objects.filter(
            job=job, at__gte=max(window_start, started), utilization__isnull=False
        ).values_list("at", "utilization")
        for at, utilization in samples:
            busiest[at] = max(busiest.get(at, 0.0), utilization or 0.0)
        threshold = policy["gpu_busy_percent"]
        busy = last_busy_at(
            sorted(busiest.items()),
            threshold=threshold,
            fresh_after=now - GPU_READINGS_STALE,
        )
        if busy is None:
            detail = "no recent reading: counted as active"
        elif busiest.get(busy, 0.0) > threshold:
            detail = f"busiest GPU above {threshold} % at {_at(busy)}"
        else:
            detail = f"every GPU under {threshold} % since {_at(busy)}"
        sources.append(Activity("gpu", busy, detail))
    if idle_check.is_configured():
        sources.append(
            idle_check.staff_check_activity(environment, started=started, now=now, readings=sources)
        )
    return sources


def environment_deletion_at(environment: Environment) -> datetime | None:
    """When a stopped (or failed) environment is deleted with its home volume by its
    policy's `delete_after_stopped_days` (at the earliest: its creator is told a day
    before); None when the policy keeps it, or it isn't stopped."""
    days = (environment.idle_policy or {}).get("delete_after_stopped_days")
    if not days or environment.active:
        return None
    job = environment.current_job
    stopped_at = environment.created_at if job is None else job.finished_at or job.status_changed_at
    return stopped_at + timedelta(days=days)
