"""In-app notifications (the bell), each with an optional e-mail."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from console.caching import forget
from console.models import Notification, Tenant, User
from console.selectors import unread_cache_key
from console.services.mail import email_send_later


def notify(
    *,
    tenant: Tenant,
    user: User | None,
    title: str,
    body: str = "",
    url: str = "",
    level: str = "info",
    email: bool = True,
) -> None:
    """In-app notification, plus an e-mail (queued after commit) when asked."""
    if user is None or not user.is_active:
        return
    Notification.objects.create(
        tenant=tenant, user=user, title=title[:200], body=body, url=url[:300], level=level
    )
    if email:
        transaction.on_commit(
            lambda: email_send_later(
                subject=f"[GpuGeek] {title}",
                body=f"{body}\n\n{url}".strip(),
                recipients=[user.email],
            )
        )


def notifications_mark_read(*, user: User, tenant: Tenant, notification_id: int | None = None):
    unread = Notification.objects.for_tenant(tenant).filter(user=user).unread()
    if notification_id is not None:
        unread = unread.filter(pk=notification_id)
    marked = unread.update(read_at=timezone.now())
    forget([unread_cache_key(user.pk, tenant.pk)])  # an update sends no model signal
    return marked
