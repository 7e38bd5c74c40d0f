"""Reads about payments: a tenant's credit and its history, the packs on offer, an
invoice's state at Stripe, and the payment failures the dashboard shows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest

from billing.models import (
    CreditMovement,
    CreditPack,
    CreditPurchase,
    CreditPurchaseStatus,
    Invoice,
    InvoiceStatus,
    StripeInvoice,
    TenantBillingProfile,
)
from billing.payments.client import stripe_configured
from console.models import Tenant
from console.permissions import Capability, has_capability
from marketplace.selectors import new_tenant_policy

HISTORY = 200  # movements shown on the credit page; the API pages through all


def credit_balance(*, tenant: Tenant) -> Decimal:
    balance = (
        TenantBillingProfile.objects.for_tenant(tenant)
        .values_list("credit_balance", flat=True)
        .first()
    )
    return balance if balance is not None else Decimal("0.00")


def credit_required_before_launch(*, tenant: Tenant) -> bool:
    """The policy for new organisations, where Stripe is set up: an organisation that has
    neither credit nor a paid invoice launches nothing yet (staff's opening balance or a
    credit purchase lifts it)."""
    if not stripe_configured() or not new_tenant_policy().require_credit:
        return False
    if credit_balance(tenant=tenant) > 0:
        return False
    return not Invoice.objects.for_tenant(tenant).filter(status=InvoiceStatus.PAID).exists()


def dashboard_credit_context(request: HttpRequest) -> dict[str, Any]:
    """The dashboard's "Add credit to launch" panel (registered with console.dashboard by
    BillingConfig)."""
    tenant = getattr(request, "tenant", None)
    if tenant is None or not credit_required_before_launch(tenant=tenant):
        return {}
    membership = getattr(request, "membership", None)
    return {
        "dashboard_panels": ["billing/partials/dashboard_credit_required.html"],
        "can_buy_credit": has_capability(membership, Capability.BUY_CREDIT),
    }


def credit_movements(*, tenant: Tenant) -> QuerySet[CreditMovement]:
    return CreditMovement.objects.for_tenant(tenant).select_related(
        "invoice", "credit_note", "purchase"
    )


def credit_packs_offered() -> QuerySet[CreditPack]:
    return CreditPack.objects.filter(active=True)


def credit_purchases_pending(*, tenant: Tenant) -> QuerySet[CreditPurchase]:
    return CreditPurchase.objects.for_tenant(tenant).filter(
        status=CreditPurchaseStatus.PENDING, stripe_checkout_session_id__gt=""
    )


@dataclass(frozen=True)
class StripeState:
    """What an invoice page says about Stripe."""

    configured: bool
    applies: bool  # a finalized invoice with something to collect online
    sent: bool
    pay_url: str
    last_error: str
    stripe_invoice_id: str
    hosted_invoice_url: str

    @property
    def sync_status(self) -> str:
        """One word for scripts: `sent` (finalized at Stripe), `pending` (to be sent;
        retried), `not_applicable` (nothing to collect online), `not_configured`."""
        if self.sent:
            return "sent"
        if not self.configured:
            return "not_configured"
        return "pending" if self.applies else "not_applicable"


STRIPE_SYNC_STATUSES = ("sent", "pending", "not_applicable", "not_configured")


def invoice_stripe_state(*, invoice: Invoice) -> StripeState:
    pushed = StripeInvoice.objects.filter(invoice=invoice).first()
    return StripeState(
        hosted_invoice_url=pushed.hosted_invoice_url if pushed is not None else "",
        configured=stripe_configured(),
        applies=(invoice.status == InvoiceStatus.OPEN and invoice.amount_due > 0)
        or pushed is not None,
        sent=pushed is not None and pushed.sent_at is not None,
        pay_url=(
            pushed.hosted_invoice_url
            if pushed is not None and invoice.status == InvoiceStatus.OPEN
            else ""
        ),
        last_error=pushed.last_error if pushed is not None else "",
        stripe_invoice_id=pushed.stripe_invoice_id if pushed is not None else "",
    )


def invoices_payment_failed(*, tenant: Tenant) -> QuerySet[Invoice]:
    """Open invoices whose last collection attempt failed."""
    return Invoice.objects.for_tenant(tenant).filter(
        status=InvoiceStatus.OPEN, payment_failed_at__isnull=False
    )


@dataclass(frozen=True)
class FailedPayment:
    invoice_id: int
    number: str
    amount_due: Decimal
    currency: str
    failed_at: datetime
    message: str
    pay_url: str


def dashboard_payments_context(request: HttpRequest) -> dict[str, Any]:
    """The dashboard's payment-failure panel, for those who see invoices (registered with
    console.dashboard by BillingConfig)."""
    membership = getattr(request, "membership", None)
    tenant = getattr(request, "tenant", None)
    if tenant is None or not has_capability(membership, Capability.VIEW_INVOICES):
        return {}
    failed = [
        FailedPayment(
            invoice_id=invoice.pk,
            number=invoice.number or "",
            amount_due=invoice.amount_due,
            currency=invoice.currency,
            failed_at=invoice.payment_failed_at,  # type: ignore[arg-type]
            message=invoice.payment_failure_message,
            # No StripeInvoice row (never pushed): the reverse one-to-one raises an
            # AttributeError subclass, so getattr's default applies.
            pay_url=getattr(getattr(invoice, "stripe", None), "hosted_invoice_url", ""),
        )
        for invoice in invoices_payment_failed(tenant=tenant).select_related("stripe")
    ]
    if not failed:
        return {}
    return {
        "dashboard_panels": ["billing/partials/dashboard_payment_failed.html"],
        "failed_payments": failed,
    }
