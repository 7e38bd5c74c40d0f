"""Credit API: the caller's organisation's credit balance and its history (owner, admin,
finance). Read-only: credit is bought in the console, through Stripe Checkout."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.models import CreditMovement
from billing.payments.selectors import credit_balance, credit_movements
from console.api.fields import StrictModelSerializer, StrictURLField
from console.api.pagination import PageSizePagination
from console.permissions import Capability

MONEY = {"max_digits": 18, "decimal_places": 2, "coerce_to_string": True}


class CreditMovementSerializer(StrictModelSerializer):
    amount = serializers.DecimalField(**MONEY)
    balance_after = serializers.DecimalField(**MONEY)
    invoice = serializers.SlugRelatedField(slug_field="number", read_only=True)
    credit_note = serializers.SlugRelatedField(slug_field="number", read_only=True)

    class Meta:
        model = CreditMovement
        fields = [
            "id", "kind", "amount", "balance_after", "description", "invoice", "credit_note",
            "created_at",
        ]  # fmt: skip


class CreditSerializer(serializers.Serializer):
    """The balance, then the page envelope of the movements, newest first."""

    balance = serializers.DecimalField(**MONEY)
    count = serializers.IntegerField()
    next = StrictURLField(allow_null=True)
    previous = StrictURLField(allow_null=True)
    results = CreditMovementSerializer(many=True)


class CreditView(APIView):
    required_capability = Capability.VIEW_INVOICES

    @extend_schema(responses=CreditSerializer)
    def get(self, request: Request) -> Response:
        tenant = request.tenant  # type: ignore[attr-defined]
        paginator = PageSizePagination()
        page = paginator.paginate_queryset(credit_movements(tenant=tenant), request, view=self)
        response = paginator.get_paginated_response(CreditMovementSerializer(page, many=True).data)
        response.data = {"balance": f"{credit_balance(tenant=tenant):.2f}", **response.data}
        return response
