"""Platform staff's edits of a tenant's billing settings: tax rate and label, payment
terms. The discount is the marketplace's (`TenantPricing`, priced into the ledger) and
is edited there; credit changes only through `credit_ledger`.

The settings apply from the next finalization: finalizing recomputes an invoice's tax
and sets its due date from the profile, so drafts follow and finalized invoices don't.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.http import HttpRequest

from billing.invoices.services import billing_profile_for
from billing.models import TenantBillingProfile
from console.models import Tenant, User
from console.service_errors import ServiceError
from console.services.audit import audit_record

MAX_TAX_PERCENT = Decimal(100)
TAX_QUANTUM = Decimal("0.001")
MAX_PAYMENT_TERMS_DAYS = 365


def billing_profile_update(
    *,
    tenant: Tenant,
    tax_rate_percent: Decimal,
    tax_label: str,
    payment_terms_days: int,
    user: User,
    request: HttpRequest | None = None,
) -> TenantBillingProfile:
    """Set the tenant's tax and payment terms; audited (who, from what, to what)."""
    if not isinstance(tax_rate_percent, Decimal) or not tax_rate_percent.is_finite():
        raise ServiceError("Give the tax rate as a number.", field="tax_rate_percent")
    if not Decimal(0) <= tax_rate_percent <= MAX_TAX_PERCENT:
        raise ServiceError("A tax rate is between 0 and 100 %.", field="tax_rate_percent")
    if tax_rate_percent != tax_rate_percent.quantize(TAX_QUANTUM):
        raise ServiceError("A tax rate has at most 3 decimals.", field="tax_rate_percent")
    label = (tax_label or "").strip()
    if not label:
        raise ServiceError("Name the tax (e.g. VAT, GST, Sales tax).", field="tax_label")
    if len(label) > 40:
        raise ServiceError("A tax label is at most 40 characters.", field="tax_label")
    if not 0 <= payment_terms_days <= MAX_PAYMENT_TERMS_DAYS:
        raise ServiceError(
            f"Payment terms are 0 to {MAX_PAYMENT_TERMS_DAYS} days.", field="payment_terms_days"
        )
    with transaction.atomic():
        profile = billing_profile_for(tenant=tenant, lock=True)
        before = {
            "tax_rate_percent": str(profile.tax_rate_percent),
            "tax_label": profile.tax_label,
            "payment_terms_days": profile.payment_terms_days,
        }
        profile.tax_rate_percent = tax_rate_percent.quantize(TAX_QUANTUM)
        profile.tax_label = label
        profile.payment_terms_days = payment_terms_days
        profile.save(update_fields=["tax_rate_percent", "tax_label", "payment_terms_days"])
        after = {
            "tax_rate_percent": str(profile.tax_rate_percent),
            "tax_label": profile.tax_label,
            "payment_terms_days": profile.payment_terms_days,
        }
        audit_record(
            action="billing.profile_update",
            tenant=tenant,
            actor=user,
            target=profile,
            request=request,
            metadata={"before": before, "after": after},
        )
    return profile
