"""Invoices API: tenants read their own (owner, admin, finance); platform staff read every
tenant's and drive the lifecycle. Another tenant's invoice is a 404."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from billing.credit_notes import services as credit_notes
from billing.invoices import services as invoicing
from billing.invoices.selectors import invoices_visible
from billing.models import CreditNote, Invoice, InvoiceLine, InvoiceStatus
from billing.payments.selectors import STRIPE_SYNC_STATUSES, invoice_stripe_state
from billing.selectors import utc_midnight
from console.api.fields import StrictCharField, StrictModelSerializer
from console.models import Tenant
from console.permissions import Capability, has_capability

MONEY = {"max_digits": 24, "decimal_places": 9, "coerce_to_string": True}


class CanViewInvoices(BasePermission):
    """Staff: every invoice, and the lifecycle actions. Others: read their tenant's with
    the invoices capability; creating is refused (403), an action on an invoice is 404."""

    message = "Your role does not allow this."

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if user.is_staff:
            return True
        if view.action not in ("list", "retrieve"):
            if "pk" in view.kwargs:  # a staff action on an invoice: not advertised
                raise NotFound()
            return False
        return has_capability(getattr(request, "membership", None), Capability.VIEW_INVOICES)


class InvoiceLineSerializer(StrictModelSerializer):
    amount = serializers.DecimalField(**MONEY)

    class Meta:
        model = InvoiceLine
        fields = [
            "id", "kind", "description", "gpu_type", "tier", "region", "quantity", "unit",
            "unit_price", "amount", "price_version", "reason", "redone_gpu_seconds",
        ]  # fmt: skip


class CreditNoteSerializer(StrictModelSerializer):
    lines = serializers.SerializerMethodField()

    class Meta:
        model = CreditNote
        fields = ["id", "number", "reason", "total", "created_at", "lines"]

    def get_lines(self, note: CreditNote) -> list[dict]:
        return [
            {
                "description": ln.description,
                "amount": str(ln.amount),
                "invoice_line": ln.invoice_line_id,
            }
            for ln in note.lines.all()
        ]


class InvoiceSerializer(StrictModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    subtotal = serializers.DecimalField(**MONEY)
    discount = serializers.DecimalField(**MONEY)
    tax = serializers.DecimalField(**MONEY)
    rounding = serializers.DecimalField(**MONEY)

    class Meta:
        model = Invoice
        fields = [
            "id", "number", "tenant", "status", "period_start", "period_end", "currency",
            "subtotal", "discount", "discount_percent", "tax", "tax_label", "tax_rate_percent",
            "rounding", "total", "credits_applied", "amount_credited", "amount_due", "due_at",
            "finalized_at", "paid_at", "voided_at", "created_at",
        ]  # fmt: skip


class InvoiceStripeSerializer(serializers.Serializer):
    """The invoice at Stripe, read-only (`billing.payments.selectors.StripeState`)."""

    sync_status = serializers.ChoiceField(choices=STRIPE_SYNC_STATUSES, read_only=True)
    stripe_invoice_id = StrictCharField(
        read_only=True, help_text="Empty until the invoice is created at Stripe."
    )
    hosted_invoice_url = StrictCharField(
        read_only=True, help_text="Stripe's payment page; empty until sent."
    )


class InvoiceDetailSerializer(InvoiceSerializer):
    lines = InvoiceLineSerializer(many=True, read_only=True)
    credit_notes = CreditNoteSerializer(many=True, read_only=True)
    stripe = serializers.SerializerMethodField()

    class Meta(InvoiceSerializer.Meta):
        fields = [*InvoiceSerializer.Meta.fields, "lines", "credit_notes", "stripe"]

    @extend_schema_field(InvoiceStripeSerializer)
    def get_stripe(self, invoice: Invoice) -> dict:
        return InvoiceStripeSerializer(invoice_stripe_state(invoice=invoice)).data


class InvoiceCreateSerializer(serializers.Serializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", queryset=Tenant.objects.all())
    period_start = serializers.DateField()
    period_end = serializers.DateField(help_text="Exclusive")


class CreditLineSerializer(serializers.Serializer):
    description = StrictCharField(max_length=300, required=False, allow_blank=True)
    amount = serializers.DecimalField(max_digits=18, decimal_places=2)
    invoice_line = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="Id of the invoice line it credits: at most what is left of that line.",
    )


class CreditNoteCreateSerializer(serializers.Serializer):
    reason = StrictCharField(allow_blank=True, required=False, default="")
    amount = serializers.DecimalField(max_digits=18, decimal_places=2, required=False)
    lines = CreditLineSerializer(many=True, required=False)


class InvoiceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    permission_classes = [CanViewInvoices]
    lookup_value_regex = r"\d+"

    def get_queryset(self):
        return invoices_visible(
            tenant=getattr(self.request, "tenant", None),
            staff=self.request.user.is_staff,
            tenant_slug=self.request.query_params.get("tenant", ""),
        ).prefetch_related("lines", "credit_notes__lines")

    def get_serializer_class(self):
        return InvoiceSerializer if self.action == "list" else InvoiceDetailSerializer

    def _detail(self, invoice: Invoice, code: int = status.HTTP_200_OK) -> Response:
        invoice = self.get_queryset().get(pk=invoice.pk)
        return Response(InvoiceDetailSerializer(invoice).data, status=code)

    @extend_schema(parameters=[OpenApiParameter("tenant", str, description="Staff: one tenant")])
    def list(self, request: Request, *args, **kwargs) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=InvoiceCreateSerializer, responses={201: InvoiceDetailSerializer})
    def create(self, request: Request) -> Response:
        body = InvoiceCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        invoice = invoicing.invoice_draft_create(
            tenant=body.validated_data["tenant"],
            period_start=utc_midnight(body.validated_data["period_start"]),
            period_end=utc_midnight(body.validated_data["period_end"]),
            user=request.user,
        )
        return self._detail(invoice, status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=InvoiceDetailSerializer)
    @action(detail=True, methods=["post"])
    def finalize(self, request: Request, pk=None) -> Response:
        return self._detail(
            invoicing.invoice_finalize(invoice=self.get_object(), user=request.user)
        )

    @extend_schema(request=None, responses=InvoiceDetailSerializer)
    @action(detail=True, methods=["post"])
    def void(self, request: Request, pk=None) -> Response:
        invoice = invoicing.invoice_status_change(
            invoice=self.get_object(), to=InvoiceStatus.VOID, user=request.user
        )
        return self._detail(invoice)

    @extend_schema(request=None, responses=InvoiceDetailSerializer)
    @action(detail=True, methods=["post"])
    def mark_uncollectible(self, request: Request, pk=None) -> Response:
        invoice = invoicing.invoice_status_change(
            invoice=self.get_object(), to=InvoiceStatus.UNCOLLECTIBLE, user=request.user
        )
        return self._detail(invoice)

    @extend_schema(request=CreditNoteCreateSerializer, responses={201: InvoiceDetailSerializer})
    @action(detail=True, methods=["post"])
    def credit_notes(self, request: Request, pk=None) -> Response:
        invoice = self.get_object()
        body = CreditNoteCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        lines = [
            credit_notes.CreditLine(
                description=ln.get("description", ""),
                amount=ln["amount"],
                invoice_line_id=ln.get("invoice_line"),
            )
            for ln in data.get("lines", [])
        ]
        credit_notes.credit_note_create(
            invoice=invoice,
            reason=data["reason"],
            amount=data.get("amount"),
            lines=lines or None,
            user=request.user,
        )
        return self._detail(invoice, status.HTTP_201_CREATED)
