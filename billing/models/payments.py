"""Payments: the tenant credit ledger, prepaid credit packs bought through Stripe
Checkout, our invoices' copies at Stripe, and the Stripe webhook events received.

- `TenantBillingProfile.credit_balance` is the current balance; every change to it writes
  one `CreditMovement` (in the same transaction, under the profile's row lock), so the
  movements are its history and sum to it (from the opening balance on).
- Every Stripe call that creates something carries an idempotency key that is stored on
  our row before the call (`CreditPurchase.idempotency_key`, `StripeInvoice.*_key`,
  `StripeInvoiceItem.idempotency_key`, `StripeCreditNote.idempotency_key`): a retry
  after a timeout sends the same key, and Stripe answers with the object it already
  made instead of a second one.
- A webhook event is stored once (`StripeEvent.event_id` is unique): a duplicate delivery,
  even a concurrent one, fails that insert and changes nothing.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from billing.models.invoices import MONEY, CreditNote, Invoice, InvoiceLine
from console.tenancy import TenantOwnedModel, TenantScopedQuerySet


class CreditMovementKind(models.TextChoices):
    OPENING = "opening", "Opening balance"
    PURCHASE = "purchase", "Credit purchase"
    CREDIT_NOTE = "credit_note", "Credit note"
    INVOICE = "invoice", "Used by an invoice"


class CreditMovement(TenantOwnedModel):
    """One change of a tenant's credit balance: positive adds credit, negative uses it."""

    tenant = models.ForeignKey(
        "console.Tenant", on_delete=models.CASCADE, related_name="credit_movements"
    )
    kind = models.CharField(max_length=16, choices=CreditMovementKind.choices)
    amount = models.DecimalField(**MONEY)
    balance_after = models.DecimalField(**MONEY)
    description = models.CharField(max_length=300)
    invoice = models.ForeignKey(
        Invoice, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    credit_note = models.ForeignKey(
        CreditNote, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    purchase = models.ForeignKey(
        "billing.CreditPurchase",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="movements",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            # A purchase is credited once, whatever delivers its completion how often.
            models.UniqueConstraint(
                fields=["purchase"],
                condition=Q(purchase__isnull=False),
                name="credit_movement_purchase_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.amount:+} ({self.get_kind_display()})"


class CreditPack(models.Model):
    """Prepaid credit that tenants can buy (set by platform staff in the admin)."""

    name = models.CharField(max_length=80)
    amount = models.DecimalField(**MONEY)
    currency = models.CharField(max_length=3, default="USD")
    active = models.BooleanField(default=True)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["position", "amount", "pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.amount} {self.currency})"


class CreditPurchaseStatus(models.TextChoices):
    PENDING = "pending", "Waiting for payment"
    PAID = "paid", "Paid"


class CreditPurchase(TenantOwnedModel):
    """A tenant's purchase of a credit pack through Stripe Checkout. Made (with its key)
    before the Checkout Session is created; credited once, when Stripe reports payment."""

    tenant = models.ForeignKey(
        "console.Tenant", on_delete=models.CASCADE, related_name="credit_purchases"
    )
    pack = models.ForeignKey(CreditPack, on_delete=models.PROTECT, related_name="purchases")
    # Copied from the pack: staff may change the pack while a purchase is open.
    amount = models.DecimalField(**MONEY)
    currency = models.CharField(max_length=3)
    status = models.CharField(
        max_length=16, choices=CreditPurchaseStatus.choices, default=CreditPurchaseStatus.PENDING
    )
    idempotency_key = models.CharField(max_length=255, unique=True)
    stripe_checkout_session_id = models.CharField(max_length=255, blank=True, db_index=True)
    checkout_url = models.URLField(max_length=2000, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    paid_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.amount} {self.currency} credit ({self.get_status_display().lower()})"


class StripePush(models.Model):
    """How sending one of our rows to Stripe went: done (`sent_at`), tries, last error."""

    sent_at = models.DateTimeField(null=True, blank=True)  # made (and finalized) at Stripe
    attempts = models.PositiveIntegerField(default=0)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class StripeInvoice(StripePush):
    """Our finalized invoice's copy at Stripe: the keys of its calls (stored before the
    first one), the ids Stripe gave, and how the push went."""

    invoice = models.OneToOneField(Invoice, on_delete=models.CASCADE, related_name="stripe")
    idempotency_key = models.CharField(max_length=255, unique=True)
    finalize_idempotency_key = models.CharField(max_length=255, unique=True)
    stripe_invoice_id = models.CharField(max_length=255, blank=True, db_index=True)
    hosted_invoice_url = models.URLField(max_length=2000, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "invoice__tenant"

    def __str__(self) -> str:
        return f"{self.invoice} at Stripe ({self.stripe_invoice_id or 'not created'})"


class StripeInvoiceItem(models.Model):
    """One invoice item of the Stripe invoice: an invoice line, or the tax, the rounding,
    the credit applied. Its amount is fixed when planned, so a retry sends the very same
    parameters (Stripe refuses a reused key with different ones)."""

    stripe_invoice = models.ForeignKey(
        StripeInvoice, on_delete=models.CASCADE, related_name="items"
    )
    invoice_line = models.ForeignKey(
        InvoiceLine, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    description = models.CharField(max_length=300)
    amount_cents = models.BigIntegerField()
    idempotency_key = models.CharField(max_length=255, unique=True)
    stripe_id = models.CharField(max_length=255, blank=True)
    position = models.PositiveIntegerField(default=0)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "stripe_invoice__invoice__tenant"

    class Meta:
        ordering = ["position", "pk"]

    def __str__(self) -> str:
        return f"{self.description}: {Decimal(self.amount_cents) / 100}"


class StripeCreditNote(StripePush):
    """Our credit note's copy at Stripe, against the Stripe invoice of its invoice; its
    key (from our credit-note number) is stored before the first call.

    `in_invoice`: the note existed when the invoice's Stripe items were planned, so the
    Stripe invoice already bills it (its "Credit notes" item) and nothing is sent."""

    credit_note = models.OneToOneField(CreditNote, on_delete=models.CASCADE, related_name="stripe")
    idempotency_key = models.CharField(max_length=255, unique=True)
    in_invoice = models.BooleanField(default=False)
    stripe_credit_note_id = models.CharField(max_length=255, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "credit_note__invoice__tenant"

    def __str__(self) -> str:
        return f"{self.credit_note} at Stripe ({self.stripe_credit_note_id or 'not created'})"


class StripeEvent(models.Model):
    """A webhook event received from Stripe, stored once by its id."""

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=255, blank=True)
    outcome = models.CharField(max_length=300, blank=True)  # what it changed, if anything
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-received_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.event_id} {self.type}"
