"""What every page needs: navigation, the tenant switcher, the role's capabilities."""

from __future__ import annotations

from django.urls import NoReverseMatch, reverse

from console.permissions import Capability, has_capability
from console.selectors import memberships_of_user, unread_notification_count

# (label, url name, capability). A section whose URL isn't registered yet is shown
# disabled rather than linking to a 404; it lights up when its app provides the URL.
NAVIGATION = [
    ("Launch", "jobs:launch", Capability.LAUNCH_JOBS),
    ("Jobs", "jobs:list", Capability.VIEW_TENANT),
    ("Storage", "storage:volumes", Capability.VIEW_TENANT),
    ("Services", "services:list", Capability.VIEW_TENANT),
    ("Environments", "environments:list", Capability.VIEW_TENANT),
    ("Catalog", "marketplace:offers", None),  # shared catalog: any signed-in user
    ("Costs", "billing:costs", Capability.VIEW_TENANT),
    ("Budgets", "billing:budgets", Capability.VIEW_TENANT),
    ("Invoices", "billing:invoices", Capability.VIEW_INVOICES),
]


def _nav_items(request) -> list[dict]:
    membership = getattr(request, "membership", None)
    items = []
    for label, url_name, capability in NAVIGATION:
        if capability is not None and not has_capability(membership, capability):
            continue
        try:
            url = reverse(url_name)
        except NoReverseMatch:
            url = None
        items.append({"label": label, "url": url, "active": False})
    # The most specific matching section is the current one (/jobs/launch/ is Launch).
    matching = [i for i in items if i["url"] and request.path.startswith(i["url"])]
    if matching:
        max(matching, key=lambda i: len(i["url"]))["active"] = True
    return items


def console(request) -> dict:
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    membership = getattr(request, "membership", None)
    tenant = getattr(request, "tenant", None)
    return {
        "nav_items": _nav_items(request),
        "current_tenant": tenant,
        # Its members see a banner on every page while staff suspend it.
        "tenant_suspension": (
            {"since": tenant.suspended_at, "reason": tenant.suspension_reason}
            if tenant is not None and tenant.suspended_at is not None
            else None
        ),
        "current_membership": membership,
        "my_memberships": (
            request.my_memberships
            if hasattr(request, "my_memberships")
            else memberships_of_user(user=request.user)
        ),
        "can": {cap.value: has_capability(membership, cap) for cap in Capability},
        "unread_notifications": (
            unread_notification_count(user=request.user, tenant=membership.tenant)
            if membership
            else 0
        ),
    }
