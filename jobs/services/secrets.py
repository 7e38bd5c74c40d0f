"""Organisation secrets (HF_TOKEN…): stored encrypted, injected into jobs by name.

A job that can use a secret can read it (its code sees the environment), so using one is
as much a privilege as seeing it: a secret is usable only in the projects it lists (none
listed: any project), and only by the jobs of those who manage secrets (owners, admins)
unless it says members may use it. Every launch (form, API, clone, template) is checked
here, in `tenant_secrets_resolve`.
"""

from __future__ import annotations

from dataclasses import replace

from django.db import transaction

from console.crypto import decrypt_json, encrypt_json
from console.models import Tenant, User
from console.permissions import Capability, has_capability
from console.selectors import membership_of
from console.services.audit import audit_record
from jobs.models import TenantSecret
from jobs.services.spec import (
    ENV_NAME_RE,
    MAX_ENV_VALUE_BYTES,
    RESERVED_ENV_PREFIXES,
    JobSpec,
    invalid,
    validate_secret_names,
)

MAX_SECRET_PROJECTS = 50
MAX_PROJECT_NAME = 100  # Job.project's length


def _may_use_any_secret(*, tenant: Tenant, user: User | None) -> bool:
    """Whether the launching user's role lets their jobs use secrets not open to members:
    the roles that manage secrets (they can set any value anyway)."""
    if user is None:
        return False
    membership = membership_of(user=user, tenant=tenant)
    return has_capability(membership, Capability.MANAGE_SECRETS)


def _refusal(secret: TenantSecret, *, project: str, privileged: bool) -> str | None:
    """Why this launch may not use `secret` (None: it may). Says nothing of its value."""
    if secret.projects and project not in secret.projects:
        where = ", ".join(f"“{p}”" for p in secret.projects)
        job_project = f"project “{project}”" if project else "no project"
        return f"{secret.name} may be used only in project {where}; this job has {job_project}."
    if not secret.members_may_use and not privileged:
        return f"{secret.name} may be used only by owners' and admins' jobs."
    return None


def tenant_secrets_resolve(
    *, tenant: Tenant, user: User | None, project: str, names: list[str]
) -> dict[str, str]:
    """Values of the named tenant secrets, copied into the job at launch (a later change
    of the secret applies to later launches). Refused (400 on `secrets`) if one is
    missing, or not for this job's project or the launching user's role, or when more
    than MAX_JOB_SECRETS are named."""
    names = validate_secret_names(names)
    if not names:
        return {}
    found = {s.name: s for s in TenantSecret.objects.for_tenant(tenant).filter(name__in=names)}
    missing = sorted(set(names) - set(found))
    if missing:
        raise invalid(f"No secret named {', '.join(missing)} in your organisation.", "secrets")
    privileged = _may_use_any_secret(tenant=tenant, user=user)
    project = (project or "").strip()
    refusals = [
        reason
        for name in sorted(set(names))
        if (reason := _refusal(found[name], project=project, privileged=privileged))
    ]
    if refusals:
        raise invalid(" ".join(refusals), "secrets")
    return {name: decrypt_json(found[name].value_encrypted)["value"] for name in names}


def secrets_named_again(*, tenant: Tenant, spec: JobSpec) -> JobSpec:
    """A spec copied from a job (clone) carries the values its secrets had; those that are
    organisation secrets are named instead, so the new launch is checked (project, role)
    and gets their current values. Other secret variables stay as they were."""
    if not spec.secret_env:
        return spec
    organisation = set(
        TenantSecret.objects.for_tenant(tenant)
        .filter(name__in=list(spec.secret_env))
        .values_list("name", flat=True)
    )
    if not organisation:
        return spec
    return replace(
        spec,
        secret_env={k: v for k, v in spec.secret_env.items() if k not in organisation},
        secrets=sorted(set(spec.secrets) | organisation),
    )


def _clean_projects(projects: list[str] | None) -> list[str]:
    if projects is None:
        return []
    if isinstance(projects, str) or not isinstance(projects, list | tuple):
        raise invalid("Projects are a list of project names.", "projects")
    clean: list[str] = []
    for project in projects:
        if not isinstance(project, str):
            raise invalid("Projects are a list of project names.", "projects")
        project = project.strip()
        if not project:
            continue
        if len(project) > MAX_PROJECT_NAME:
            raise invalid(f"Project names are at most {MAX_PROJECT_NAME} characters.", "projects")
        if project not in clean:
            clean.append(project)
    if len(clean) > MAX_SECRET_PROJECTS:
        raise invalid(f"List at most {MAX_SECRET_PROJECTS} projects.", "projects")
    return clean


@transaction.atomic
def tenant_secret_set(
    *,
    tenant: Tenant,
    user: User,
    name: str,
    value: str,
    projects: list[str] | None = None,
    members_may_use: bool = False,
    request=None,
) -> TenantSecret:
    """Create or replace a secret: its value and where it may be used (no projects: any
    project; `members_may_use` off: only owners' and admins' jobs)."""
    name = (name or "").strip()
    if not ENV_NAME_RE.match(name) or name.startswith(RESERVED_ENV_PREFIXES):
        raise invalid("Secret names are environment variable names, e.g. HF_TOKEN.", "name")
    if not value:
        raise invalid("Give the secret a value.", "value")
    # A job's variable holds at most this much (jobs.services.spec): a longer secret
    # could never be used.
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ENV_VALUE_BYTES:
        raise invalid(f"A secret is at most {MAX_ENV_VALUE_BYTES // 1024} KiB.", "value")
    projects = _clean_projects(projects)
    members_may_use = bool(members_may_use)
    secret, created = TenantSecret.objects.update_or_create(
        tenant=tenant,
        name=name,
        defaults={
            "value_encrypted": encrypt_json({"value": value}),
            "created_by": user,
            "projects": projects,
            "members_may_use": members_may_use,
        },
    )
    audit_record(
        action="secret.created" if created else "secret.updated",
        tenant=tenant,
        actor=user,
        target=secret,
        request=request,
        metadata={"name": name, "projects": projects, "members_may_use": members_may_use},
    )
    return secret


@transaction.atomic
def tenant_secret_delete(*, secret: TenantSecret, user: User, request=None) -> None:
    audit_record(
        action="secret.deleted",
        tenant=secret.tenant,
        actor=user,
        target=secret,
        request=request,
        metadata={"name": secret.name},
    )
    secret.delete()
