"""Billing API: usage, cost summary, budgets."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import selectors
from billing.budgets import selectors as budget_selectors
from billing.budgets import services as budgets
from billing.models import Budget, BudgetAction
from console.api.base import TenantScopedViewSet
from console.api.fields import StrictCharField, StrictModelSerializer, StrictURLField
from console.api.params import query_params
from console.permissions import Capability
from jobs.models import Job


class UsageRowSerializer(serializers.Serializer):
    key = StrictCharField()
    gpu_seconds = serializers.DecimalField(max_digits=20, decimal_places=3)
    cpu_seconds = serializers.DecimalField(max_digits=20, decimal_places=3)
    amount = serializers.DecimalField(max_digits=24, decimal_places=9)
    currency = StrictCharField()


class UsagePageSerializer(serializers.Serializer):
    """Every row at once, in the page envelope of the other lists."""

    count = serializers.IntegerField()
    next = StrictURLField(allow_null=True)
    previous = StrictURLField(allow_null=True)
    results = UsageRowSerializer(many=True)


def _filter_text(**kwargs) -> StrictCharField:
    return StrictCharField(required=False, default="", allow_blank=True, **kwargs)


class UsageQuerySerializer(serializers.Serializer):
    start = serializers.DateField(required=False, help_text="First day; default: this month's")
    end = serializers.DateField(required=False, help_text="Last day (inclusive); default: today")
    group_by = serializers.ChoiceField(choices=list(selectors.GROUP_BY), default="gpu_type")
    gpu_type = _filter_text(max_length=40)
    tier = _filter_text(max_length=40)
    region = _filter_text(max_length=40)
    job = _filter_text(max_length=100, help_text="Part of a job's name")


class UsageView(APIView):
    @extend_schema(parameters=[UsageQuerySerializer], responses=UsagePageSerializer)
    def get(self, request):
        params = query_params(UsageQuerySerializer, request)
        now = datetime.now(UTC)
        # `end` is inclusive (a day); without it, up to today.
        start, end = selectors.date_range(
            "custom",
            start=params.get("start") or selectors.period_start(now).date(),
            end=params.get("end") or now.date(),
        )
        query = selectors.CostQuery(
            start=start,
            end=end,
            group_by=params["group_by"],
            gpu_type=params["gpu_type"],
            region=params["region"],
            tier=params["tier"],
            job_contains=params["job"],
        )
        rows = selectors.usage_rows(tenant=request.tenant, query=query)
        return Response(
            {
                "count": len(rows),
                "next": None,
                "previous": None,
                "results": UsageRowSerializer(rows, many=True).data,
            }
        )


def _decimal_text() -> StrictCharField:
    # Written with str(Decimal): as many places as the value has, so no fixed pattern.
    return StrictCharField(help_text="A decimal number, as text")


class BudgetStatusSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = StrictCharField()
    amount = _decimal_text()
    spend = _decimal_text()
    percent = _decimal_text()
    forecast = _decimal_text()
    status = serializers.ChoiceField(choices=["ok", "exhausted"])
    project = StrictCharField(allow_blank=True)
    action = serializers.ChoiceField(choices=BudgetAction.choices)


class CostSummarySerializer(serializers.Serializer):
    period_start = serializers.DateTimeField()
    month_to_date = _decimal_text()
    run_rate_per_hour = _decimal_text()
    forecast = _decimal_text()
    currency = StrictCharField()
    budgets = BudgetStatusSerializer(many=True)


class CostSummaryView(APIView):
    @extend_schema(responses=CostSummarySerializer)
    def get(self, request):
        now = datetime.now(UTC)
        _days, cumulative = selectors.cumulative_month(tenant=request.tenant, now=now)
        month_to_date = cumulative[-1] if cumulative else 0
        jobs = Job.objects.for_tenant(request.tenant)
        rate = selectors.run_rate(jobs)
        forecast = selectors.forecast_month_end(jobs=jobs, spend=Decimal(month_to_date), now=now)
        budgets = [
            {
                "id": s.budget.pk,
                "name": s.budget.name,
                "amount": str(s.budget.amount),
                "spend": str(s.spend),
                "percent": str(s.percent),
                "forecast": str(s.forecast),
                "status": "exhausted" if s.exhausted else "ok",
                "project": s.budget.project,
                "action": s.budget.action,
            }
            for s in budget_selectors.budget_statuses(tenant=request.tenant, now=now)
        ]
        return Response(
            {
                "period_start": selectors.period_start(now).isoformat(),
                "month_to_date": str(month_to_date),
                "run_rate_per_hour": str(rate),
                "forecast": str(forecast.quantize(Decimal("0.000001"))),
                "currency": "USD",
                "budgets": budgets,
            }
        )


class BudgetSerializer(StrictModelSerializer):
    amount = serializers.DecimalField(max_digits=18, decimal_places=6)
    thresholds = serializers.ListField(child=serializers.IntegerField(), required=False)
    action = serializers.ChoiceField(choices=BudgetAction.choices, required=False)
    period = serializers.ChoiceField(choices=[("monthly", "monthly")], required=False)

    class Meta:
        model = Budget
        fields = [
            "id",
            "name",
            "amount",
            "currency",
            "period",
            "thresholds",
            "action",
            "project",
            "webhook_url",
            "created_at",
        ]
        read_only_fields = ["id", "currency", "created_at"]


class BudgetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Visible to every member; created and changed by owners, admins and finance."""

    queryset = Budget.objects.all()
    serializer_class = BudgetSerializer
    required_capabilities = {
        a: Capability.MANAGE_BUDGETS
        for a in ("create", "update", "partial_update", "destroy", "rotate_webhook_secret")
    }

    @staticmethod
    def _with_new_secret(budget: Budget) -> dict:
        """The budget as GET shows it, plus its webhook secret when one was just made:
        the only response that ever carries it."""
        body = dict(BudgetSerializer(budget).data)
        if budget.new_webhook_secret:
            body["webhook_secret"] = budget.new_webhook_secret
        return body

    def create(self, request, *args, **kwargs):
        data = BudgetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        values.pop("period", None)
        budget = budgets.budget_create(
            tenant=request.tenant, user=request.user, request=request._request, **values
        )
        return Response(self._with_new_secret(budget), status=status.HTTP_201_CREATED)

    def partial_update(self, request, *args, **kwargs):
        budget = self.get_object()
        data = BudgetSerializer(budget, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        values.pop("period", None)
        budget = budgets.budget_update(
            budget=budget, user=request.user, request=request._request, **values
        )
        return Response(self._with_new_secret(budget))

    @extend_schema(request=None)
    @action(detail=True, methods=["post"], url_path="rotate-webhook-secret")
    def rotate_webhook_secret(self, request, *args, **kwargs):
        """A new signing secret for the budget's webhook, returned once; the old one stops
        verifying at once."""
        budget = self.get_object()
        budgets.budget_webhook_secret_rotate(
            budget=budget, user=request.user, request=request._request
        )
        return Response(self._with_new_secret(budget))

    def update(self, request, *args, **kwargs):
        return self.partial_update(request, *args, **kwargs)

    def destroy(self, request, *args, **kwargs):
        budgets.budget_delete(budget=self.get_object(), user=request.user, request=request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)
