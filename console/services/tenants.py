"""Organisations: creating one, with its first owner."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest
from django.utils.text import slugify

from console.models import Membership, Tenant, User
from console.permissions import Role
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from console.signals import tenant_created


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
