"""Reads for accounts and tenancy; every tenant read goes through `for_tenant`."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from console.caching import cached
from console.models import (
    ApiToken,
    AuditEvent,
    Heartbeat,
    Invitation,
    Membership,
    Notification,
    SshPublicKey,
    Tenant,
    User,
)
from console.permissions import Capability, has_capability

HEARTBEAT_COMPONENTS = ("worker", "beat", "watcher")


def ssh_keys_of_user(*, user: User) -> QuerySet[SshPublicKey]:
    """A person's own SSH keys, newest first: the only way pages and the API reach keys,
    so another person's key is a 404."""
    return SshPublicKey.objects.filter(user=user)


def ssh_keys_for_users(*, users: Iterable[User]) -> list[str]:
    """The authorized_keys lines that let `users` in (an environment's members): one line
    per key of each active user, `type base64 comment`, the comment naming the person
    and the key so sshd's log says whose key was used. Inactive accounts get no line."""
    user_ids = [user.pk for user in users]
    keys = (
        SshPublicKey.objects.filter(user_id__in=user_ids, user__is_active=True)
        .select_related("user")
        .order_by("user__email", "created_at", "id")
    )
    return [f"{key.public_key} {key.user.email} key-{key.pk}" for key in keys]


def notifications_for(*, user: User, tenant: Tenant):
    return Notification.objects.for_tenant(tenant).filter(user=user)


# Dropped by every change to what they count (console.signals); the timeouts only bound
# how long a change made without a model signal (a queryset update) could go unseen.
UNREAD_KEPT_SECONDS = 300
MEMBERSHIPS_KEPT_SECONDS = 300


def unread_cache_key(user_id: int, tenant_id: int) -> str:
    return f"unread:{user_id}:{tenant_id}"


def memberships_cache_key(user_id: int) -> str:
    return f"memberships:{user_id}"


def unread_notification_count(*, user: User, tenant: Tenant) -> int:
    """The bell's count on every page, kept in the cache (console.caching)."""
    return cached(
        unread_cache_key(user.pk, tenant.pk),
        UNREAD_KEPT_SECONDS,
        lambda: notifications_for(user=user, tenant=tenant).unread().count(),
    )


def memberships_of_user(*, user: User) -> QuerySet[Membership]:
    return (
        Membership.objects.select_related("tenant")
        .filter(user=user, tenant__is_active=True)
        .order_by("tenant__name")
    )


def membership_of(*, user: User, tenant: Tenant) -> Membership | None:
    """The user's membership of `tenant` (None: not a member), for a capability check."""
    return Membership.objects.for_tenant(tenant).filter(user=user).first()


def members_for_tenant(*, tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.for_tenant(tenant).select_related("user").order_by("user__email")


def invitations_for_tenant(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.for_tenant(tenant).select_related("invited_by")


def api_tokens_visible_to(*, membership: Membership) -> QuerySet[ApiToken]:
    """Owners and admins see every token of the tenant; others see their own."""
    tokens = ApiToken.objects.for_tenant(membership.tenant).select_related("user")
    if has_capability(membership, Capability.MANAGE_TOKENS):
        return tokens
    return tokens.filter(user=membership.user)


def staff_api_tokens_of(*, user: User) -> QuerySet[ApiToken]:
    """A staff user's automation tokens: no organisation, so no tenant to scope by."""
    return ApiToken.objects.filter(user=user, tenant__isnull=True).select_related("user")


def audit_events_for_tenant(
    *, tenant: Tenant, action_prefix: str | None = None, actor_query: str | None = None
) -> QuerySet[AuditEvent]:
    events = AuditEvent.objects.for_tenant(tenant).select_related("actor")
    if action_prefix:
        events = events.filter(action__startswith=action_prefix)
    if actor_query:
        events = events.filter(actor_label__icontains=actor_query)
    return events


def tenants_for_staff() -> QuerySet[Tenant]:
    from django.db.models import Count

    return Tenant.objects.annotate(member_count=Count("memberships")).order_by("name")


def heartbeat_status(*, now=None) -> dict[str, dict[str, Any]]:
    """Last heartbeat of each background component and whether it looks alive."""
    now = now or timezone.now()
    stale_after = timedelta(seconds=settings.HEARTBEAT_STALE_AFTER)
    seen = {hb.component: hb for hb in Heartbeat.objects.filter(component__in=HEARTBEAT_COMPONENTS)}
    status: dict[str, dict[str, Any]] = {}
    for component in HEARTBEAT_COMPONENTS:
        heartbeat = seen.get(component)
        if heartbeat is None:
            status[component] = {"status": "missing", "last_seen": None}
            continue
        age = (now - heartbeat.last_seen).total_seconds()
        status[component] = {
            "status": "ok" if age <= stale_after.total_seconds() else "stale",
            "last_seen": heartbeat.last_seen.isoformat(),
            "age_seconds": round(age, 1),
            "host": heartbeat.hostname,
            "pid": heartbeat.pid,
        }
    return status


def resolve_membership(user: Any, tenant_id: int | None) -> Membership | None:
    """The user's membership in `tenant_id`, else their first one; None if they have none."""
    return memberships_and_current(user, tenant_id)[1]


def memberships_and_current(
    user: Any, tenant_id: int | None
) -> tuple[list[Membership], Membership | None]:
    """All the user's memberships (the tenant switcher's list, in one query) and the one
    in `tenant_id`, else their first one."""
    if not user.is_authenticated:
        return [], None
    # Every page's middleware asks: kept in the cache (console.caching).
    memberships = cached(
        memberships_cache_key(user.pk),
        MEMBERSHIPS_KEPT_SECONDS,
        lambda: list(memberships_of_user(user=user)),
    )
    current = next((m for m in memberships if m.tenant_id == tenant_id), None)
    return memberships, current or (memberships[0] if memberships else None)
