"""The one tenant-scoping mechanism.

Every view, API viewset, consumer and task reaches tenant data only through
`Model.objects.for_tenant(tenant)` (or a selector that calls it). An object of another
tenant is therefore simply absent: views answer 404, never 403, so existence never leaks
(OWASP ASVS V4, deny by default). `request.tenant` and `request.membership` are set here
for browser sessions and by the API token authentication for scripts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from django.db import models
from django.http import Http404, HttpRequest

if TYPE_CHECKING:
    from console.models import Membership, Tenant

SESSION_TENANT_KEY = "gpugeek_tenant_id"

M = TypeVar("M", bound=models.Model)


class TenantScopedQuerySet(models.QuerySet):
    def for_tenant(self, tenant: Tenant | None) -> TenantScopedQuerySet:
        if tenant is None:
            return self.none()
        return self.filter(**{self.model.tenant_field: tenant})


class TenantOwnedModel(models.Model):
    """Base for every row that belongs to a tenant; `tenant_field` names the path to it."""

    tenant_field = "tenant"

    tenant = models.ForeignKey("console.Tenant", on_delete=models.CASCADE, related_name="+")

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        abstract = True


def get_for_tenant_or_404(queryset: Any, tenant: Tenant | None, **lookup: Any) -> Any:
    """Fetch one tenant-owned object or raise 404 (also for another tenant's object)."""
    if isinstance(queryset, type) and issubclass(queryset, models.Model):
        queryset = queryset.objects.all()
    try:
        return queryset.for_tenant(tenant).get(**lookup)
    except (queryset.model.DoesNotExist, ValueError, TypeError):
        raise Http404("Not found.") from None


def resolve_membership(user: Any, tenant_id: int | None) -> Membership | None:
    """The user's membership in `tenant_id`, else their first one; None if they have none."""
    from console.models import Membership

    if not user.is_authenticated:
        return None
    memberships = Membership.objects.select_related("tenant").filter(
        user=user, tenant__is_active=True
    )
    membership = None
    if tenant_id is not None:
        membership = memberships.filter(tenant_id=tenant_id).first()
    return membership or memberships.order_by("tenant__name").first()


class CurrentTenantMiddleware:
    """Sets request.tenant / request.membership from the session's chosen tenant."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        membership = resolve_membership(request.user, request.session.get(SESSION_TENANT_KEY))
        request.membership = membership
        request.tenant = membership.tenant if membership else None
        return self.get_response(request)
