"""The audit log's one writer. Every service that changes membership, credentials or
money records an event in its own transaction, so the log can't miss a change that
happened."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from console.models import AuditEvent, Tenant, User
from console.services.headers import client_ip


def audit_record(
    *,
    action: str,
    tenant: Tenant | None = None,
    actor: User | None = None,
    actor_label: str | None = None,
    target: Any = None,
    request: HttpRequest | None = None,
    metadata: dict | None = None,
) -> AuditEvent:
    request_user = getattr(request, "user", None)
    if actor is None and request_user is not None and request_user.is_authenticated:
        actor = request_user
    return AuditEvent.objects.create(
        tenant=tenant,
        actor=actor,
        actor_label=actor_label or (actor.email if actor else "system"),
        action=action,
        target_type=target._meta.model_name if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:200] if target is not None else "",
        ip_address=client_ip(request),
        metadata=metadata or {},
    )
