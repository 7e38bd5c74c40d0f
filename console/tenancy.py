"""The one tenant-scoping mechanism.

Every view, API viewset, consumer and task reaches tenant data only through
`Model.objects.for_tenant(tenant)` (or a selector that calls it). An object of another
tenant is therefore simply absent: views answer 404, never 403, so existence never leaks
(OWASP ASVS V4, deny by default). `request.tenant` and `request.membership` are set by
`console.middleware` for browser sessions and by the API token authentication for scripts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self, TypeVar

from django.db import models
from django.http import Http404

if TYPE_CHECKING:
    from console.models import Tenant

SESSION_TENANT_KEY = "gpugeek_tenant_id"

M = TypeVar("M", bound=models.Model)


class TenantScopedQuerySet(models.QuerySet):
    def for_tenant(self, tenant: Tenant | None) -> Self:
        if tenant is None:
            return self.none()
        # Every tenant-owned model names the path to its tenant.
        tenant_field: str = getattr(self.model, "tenant_field")  # noqa: B009
        return self.filter(**{tenant_field: tenant})


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
        queryset = queryset._default_manager.all()
    try:
        return queryset.for_tenant(tenant).get(**lookup)
    except (queryset.model.DoesNotExist, ValueError, TypeError):
        raise Http404("Not found.") from None
