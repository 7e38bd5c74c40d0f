"""Launch templates: a job's spec saved under a name, to launch again."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.http import HttpRequest

from console.models import User
from console.services.audit import audit_record
from jobs.models import Job, LaunchTemplate
from jobs.services.spec import JobSpec, invalid, spec_from_job

TEMPLATE_FIELDS = (
    "image",
    "command",
    "nodes",
    "gpus_per_node",
    "gpu_type",
    "cpus",
    "region",
    "spot_ratio",
    "priority",
    "max_runtime_minutes",
    "checkpoint_path",
    "project",
    "labels",
    "env",
    "auto_release",
    "ports",
    "secrets",
    "requirements",
)


@transaction.atomic
def launch_template_save(*, job: Job, name: str, user: User | None, request=None):
    """Save a job's spec to launch again. Secret values are not copied: a template names
    organisation secrets instead, so rotating one takes effect on the next launch."""

    name = (name or "").strip()
    if not name or len(name) > 100:
        raise invalid("Give the template a name (up to 100 characters).", "name")
    spec = spec_from_job(job)
    values = {key: getattr(spec, key) for key in TEMPLATE_FIELDS if key != "secrets"}
    values["spot_ratio"] = str(values["spot_ratio"])
    values["secrets"] = []
    template, _ = LaunchTemplate.objects.update_or_create(
        tenant=job.tenant, name=name, defaults={"spec": values, "created_by": user}
    )
    audit_record(
        action="launch_template.saved",
        tenant=job.tenant,
        actor=user,
        target=template,
        request=request,
        metadata={"from_job": job.pk},
    )
    return template


@transaction.atomic
def launch_template_delete(
    *, template: LaunchTemplate, user: User | None, request: HttpRequest | None = None
) -> None:
    """Delete a launch template; jobs launched from it are not affected."""
    audit_record(
        action="launch_template.deleted",
        tenant=template.tenant,
        actor=user,
        target=template,
        request=request,
        metadata={"name": template.name},
    )
    template.delete()


def spec_from_template(template, *, name: str | None = None) -> JobSpec:
    values = {key: template.spec[key] for key in TEMPLATE_FIELDS if key in template.spec}
    values["spot_ratio"] = Decimal(str(values.get("spot_ratio", "0")))
    return JobSpec(name=name or template.name, **values)
