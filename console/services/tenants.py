"""Organisations: creating one, with its first owner; the settings its owners and
admins choose for it."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest
from django.utils.text import slugify

from console.models import Membership, Tenant, User
from console.permissions import Capability, Role, has_capability
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from console.signals import tenant_created

SETTINGS_REFUSAL = "Only the organisation's owners and admins can change its settings."


def _unique_slug(name: str) -> str:
    base = slugify(name)[:50] or "org"
    slug, n = base, 1
    while Tenant.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


@transaction.atomic
def tenant_create(
    *, name: str, owner: User, slug: str | None = None, request: HttpRequest | None = None
) -> Tenant:
    name = name.strip()
    if not name:
        raise ServiceError("Give the organisation a name.", field="name")
    if slug and Tenant.objects.filter(slug=slug).exists():
        raise ServiceError(f"The slug “{slug}” is taken.", code=ErrorCode.CONFLICT, field="slug")
    tenant = Tenant.objects.create(name=name, slug=slug or _unique_slug(name))
    Membership.objects.create(tenant=tenant, user=owner, role=Role.OWNER)
    audit_record(
        action="tenant.created", tenant=tenant, actor=owner, target=tenant, request=request
    )
    tenant_created.send(sender=Tenant, tenant=tenant)
    return tenant


@transaction.atomic(durable=True)
def tenant_self_repair_defaults_set(
    *,
    tenant: Tenant,
    by_membership: Membership | None,
    hardware_repair_default: bool | None = None,
    loss_explosion_pause_default: bool | None = None,
    request: HttpRequest | None = None,
) -> Tenant:
    """Set what self-repair does for the organisation's jobs that made no choice of their
    own (None: unchanged). It applies to running jobs from their next fault or
    explosion. Owners and admins only; audited with what changed."""
    if (
        by_membership is None
        or by_membership.tenant_id != tenant.pk
        or not has_capability(by_membership, Capability.MANAGE_ORGANISATION)
    ):
        raise ServiceError(SETTINGS_REFUSAL, code=ErrorCode.FORBIDDEN)
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    asked = {
        "hardware_repair_default": hardware_repair_default,
        "loss_explosion_pause_default": loss_explosion_pause_default,
    }
    changed = {
        name: {"from": getattr(tenant, name), "to": value}
        for name, value in asked.items()
        if value is not None and getattr(tenant, name) != value
    }
    if changed:
        for name, change in changed.items():
            setattr(tenant, name, change["to"])
        tenant.save(update_fields=list(changed))
        audit_record(
            action="tenant.self_repair_defaults_set",
            tenant=tenant,
            actor=by_membership.user,
            target=tenant,
            request=request,
            metadata=changed,
        )
    return tenant
