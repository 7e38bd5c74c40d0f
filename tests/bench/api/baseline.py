"""The baselines the API is measured against, served by the same server in the same run:
a bare Django view returning a small JSON object, and a bare DRF list (a page of 50 rows
of a 5-field model, no authentication, page-number pagination)."""

from __future__ import annotations

from django.http import JsonResponse
from rest_framework import generics, serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import AllowAny

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
        # A small table's worth (the baseline tenant's 1,000 events), newest first.
        return JobEvent.objects.filter(job__tenant__slug=BASELINE_TENANT_SLUG).order_by("-pk")
