"""Base classes every API viewset builds on, so tenant scoping can't be forgotten."""

from __future__ import annotations

from rest_framework import viewsets


class TenantScopedViewSet(viewsets.GenericViewSet):
    """Querysets are always `for_tenant(request.tenant)`; a foreign id is a 404.

    Subclasses set `queryset` (a model with a TenantScopedQuerySet manager) and may narrow
    it further in `scope_queryset`.
    """

    lookup_value_regex = r"\d+"

    def get_queryset(self):
        queryset = super().get_queryset().for_tenant(self.request.tenant)
        return self.scope_queryset(queryset)

    def scope_queryset(self, queryset):
        return queryset
