"""Invoices, their lines, credit notes, gap-free numbering and tenants' billing settings.

An invoice is a view over one tenant's ledger records for a period until it is finalized;
finalizing claims those records (`UsageRecord.invoice`) and freezes the invoice: it is
never edited afterwards, corrections are credit notes (DESIGN.md, "Money path").

Money: line amounts, subtotal, discount and tax keep the ledger's precision
(AMOUNT_QUANTUM); `total` is rounded to the cent once, `rounding` says by how much.
What follows the total (credits, credit notes, amount due) is in cents.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.utils import timezone

from billing.models.usage import AMOUNT
from console.tenancy import TenantOwnedModel, TenantScopedQuerySet

CENTS = Decimal("0.01")
MONEY = {"max_digits": 18, "decimal_places": 2}
HOURS_QUANTUM = Decimal("0.0001")


class TenantBillingProfile(TenantOwnedModel):
    """A tenant's billing settings and prepaid or goodwill credit. Billing's own row (the
    console can't know billing), made on first need by `billing_profile_for`. Its row is
    also the per-tenant lock invoicing takes (drafts, finalization, credit notes)."""

    tenant = models.OneToOneField(
        "console.Tenant", on_delete=models.CASCADE, related_name="billing_profile"
    )
    tax_rate_percent = models.DecimalField(max_digits=6, decimal_places=3, default=Decimal(0))
    tax_label = models.CharField(max_length=40, default="Tax")
    payment_terms_days = models.PositiveIntegerField(default=30)
    credit_balance = models.DecimalField(default=Decimal(0), **MONEY)
    # The tenant's Stripe Customer (made on first need), and the idempotency key of its
    # creation, stored before the call so a retry after a timeout makes no second one.
    stripe_customer_id = models.CharField(max_length=255, blank=True)
    stripe_customer_idempotency_key = models.CharField(max_length=255, blank=True)

    def __str__(self) -> str:
        return f"billing profile of {self.tenant}"


class NumberKind(models.TextChoices):
    INVOICE = "invoice", "Invoice"
    CREDIT_NOTE = "credit_note", "Credit note"


NUMBER_PREFIX = {NumberKind.INVOICE: "GG", NumberKind.CREDIT_NOTE: "GGCN"}


class InvoiceNumberSequence(models.Model):
    """The last number given per kind and year. Taken under `select_for_update` in the
    transaction that uses it, so a rolled-back finalization gives its number back and
    the sequence has no gaps, even when finalizations race."""

    kind = models.CharField(max_length=16, choices=NumberKind.choices)
    year = models.PositiveIntegerField()
    last = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "year"], name="invoice_number_sequence_once")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.year}: {self.last}"


class InvoiceStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    OPEN = "open", "Open"
    PAID = "paid", "Paid"
    VOID = "void", "Void"
    UNCOLLECTIBLE = "uncollectible", "Uncollectible"


# Finalized: numbered, its records claimed, never edited again.
FINALIZED_STATUSES = (
    InvoiceStatus.OPEN,
    InvoiceStatus.PAID,
    InvoiceStatus.VOID,
    InvoiceStatus.UNCOLLECTIBLE,
)


class Invoice(TenantOwnedModel):
    tenant = models.ForeignKey("console.Tenant", on_delete=models.CASCADE, related_name="invoices")
    number = models.CharField(max_length=20, null=True, blank=True, unique=True)
    status = models.CharField(
        max_length=16, choices=InvoiceStatus.choices, default=InvoiceStatus.DRAFT
    )
    period_start = models.DateTimeField()
    period_end = models.DateTimeField(help_text="Exclusive")
    currency = models.CharField(max_length=3, default="USD")
    subtotal = models.DecimalField(default=Decimal(0), **AMOUNT)  # usage + adjustments
    # The negotiated discount already taken off the usage lines' prices (the ledger
    # records discounted prices): shown, not subtracted again.
    discount = models.DecimalField(default=Decimal(0), **AMOUNT)
    discount_percent = models.DecimalField(max_digits=5, decimal_places=2, default=Decimal(0))
    tax_rate_percent = models.DecimalField(max_digits=6, decimal_places=3, default=Decimal(0))
    tax_label = models.CharField(max_length=40, default="Tax")
    tax = models.DecimalField(default=Decimal(0), **AMOUNT)
    total = models.DecimalField(default=Decimal(0), **MONEY)
    rounding = models.DecimalField(default=Decimal(0), **AMOUNT)  # total − exact total
    credits_applied = models.DecimalField(default=Decimal(0), **MONEY)
    amount_credited = models.DecimalField(default=Decimal(0), **MONEY)  # by credit notes
    amount_due = models.DecimalField(default=Decimal(0), **MONEY)
    due_at = models.DateTimeField(null=True, blank=True)
    finalized_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    voided_at = models.DateTimeField(null=True, blank=True)
    # The last failed collection attempt Stripe reported (the invoice stays open).
    payment_failed_at = models.DateTimeField(null=True, blank=True)
    payment_failure_message = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-period_start", "-pk"]
        indexes = [models.Index(fields=["tenant", "period_start"])]

    def __str__(self) -> str:
        return self.number or f"draft {self.period_start:%Y-%m-%d}–{self.period_end:%Y-%m-%d}"

    @property
    def left_to_credit(self) -> Decimal:
        return self.total - self.amount_credited


class LineKind(models.TextChoices):
    USAGE = "usage", "Usage"
    DISCOUNT = "discount", "Discount"
    ADJUSTMENT = "adjustment", "Adjustment"
    CREDIT = "credit", "Credit"
    TAX = "tax", "Tax"


class InvoiceLine(models.Model):
    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    kind = models.CharField(max_length=12, choices=LineKind.choices)
    description = models.CharField(max_length=300)
    gpu_type = models.CharField(max_length=40, blank=True, help_text="GPU type slug, or 'cpu'")
    tier = models.CharField(max_length=16, blank=True)
    region = models.CharField(max_length=40, blank=True)
    quantity = models.DecimalField(max_digits=20, decimal_places=4, null=True, blank=True)
    unit = models.CharField(max_length=16, blank=True)  # GPU-hour | vCPU-hour
    unit_price = models.DecimalField(max_digits=18, decimal_places=9, null=True, blank=True)
    amount = models.DecimalField(**AMOUNT)
    price_version = models.ForeignKey(
        "marketplace.PriceVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    reason = models.TextField(blank=True)  # adjustments
    position = models.PositiveIntegerField(default=0)
    # Of the usage: GPU-seconds redone after preemption since the job's last checkpoint.
    redone_gpu_seconds = models.DecimalField(max_digits=20, decimal_places=3, null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "invoice__tenant"

    class Meta:
        ordering = ["position", "pk"]

    def __str__(self) -> str:
        return f"{self.description}: {self.amount}"


class CreditNote(models.Model):
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="credit_notes")
    number = models.CharField(max_length=20, unique=True)
    reason = models.TextField()
    total = models.DecimalField(**MONEY)
    # How much of it reduced the amount due, and how much became tenant credit.
    reduced_amount_due = models.DecimalField(default=Decimal(0), **MONEY)
    credited_to_balance = models.DecimalField(default=Decimal(0), **MONEY)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "invoice__tenant"

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return self.number


class CreditNoteLine(models.Model):
    credit_note = models.ForeignKey(CreditNote, on_delete=models.CASCADE, related_name="lines")
    description = models.CharField(max_length=300)
    amount = models.DecimalField(**MONEY)
    invoice_line = models.ForeignKey(
        InvoiceLine, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.description}: {self.amount}"
