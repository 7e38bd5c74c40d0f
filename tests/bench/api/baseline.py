"""The baselines the API is measured against, served by the same server in the same run:
a bare Django view returning a small JSON object, and a bare DRF list (a page of 50 rows
of a 5-field model, no authentication, page-number pagination)."""

from __future__ import annotations

import functools

from django.http import JsonResponse
from rest_framework import generics, serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import AllowAny

from console.models import Tenant
from jobs.models import JobEvent

BASELINE_TENANT_SLUG = "bench-baseline"


def bare_json(request):
    return JsonResponse({"status": "ok", "items": [1, 2, 3]})


class _EventRow(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "from_status", "to_status", "actor", "reason"]


class _Fifty(PageNumberPagination):
    page_size = 50


class BareDrfList(generics.ListAPIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]
    serializer_class = _EventRow
    pagination_class = _Fifty

    def get_queryset(self):
        # A small table's worth (the baseline tenant's 1,000 events), newest first. By
        # the tenant's id: by its slug, through a join, the planner can't tell the small
        # tenant from the 100,000-job one and counts by scanning every event (~100 ms).
        return JobEvent.objects.filter(job__tenant_id=_baseline_tenant_id()).order_by("-pk")


@functools.cache
def _baseline_tenant_id() -> int:
    return Tenant.objects.values_list("pk", flat=True).get(slug=BASELINE_TENANT_SLUG)
