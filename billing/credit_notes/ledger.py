"""The one way a tenant's credit balance changes: `credit_balance_move` updates
`TenantBillingProfile.credit_balance` and writes the `CreditMovement` that explains it.

Credit comes from credit notes (what exceeds the amount due), prepaid purchases and an
opening balance; invoices use it when they are finalized. Callers hold the profile's row
lock (`billing_profile_for(tenant=…, lock=True)`) in the transaction that moves it, which
is also the per-tenant invoicing lock: balance and movements can't drift apart.
"""

from __future__ import annotations

from decimal import Decimal

from billing.models import (
    CENTS,
    CreditMovement,
    CreditMovementKind,
    CreditNote,
    CreditPurchase,
    Invoice,
    TenantBillingProfile,
)
from console.models import User
from console.service_errors import ErrorCode, ServiceError


def credit_balance_move(
    *,
    profile: TenantBillingProfile,
    amount: Decimal,
    kind: CreditMovementKind,
    description: str,
    invoice: Invoice | None = None,
    credit_note: CreditNote | None = None,
    purchase: CreditPurchase | None = None,
    user: User | None = None,
) -> CreditMovement:
    """Add `amount` (negative: use) to the locked profile's balance and record it."""
    if amount != amount.quantize(CENTS) or amount == 0:
        raise ValueError(f"a credit movement is a non-zero amount in cents, not {amount}")
    balance = profile.credit_balance + amount
    if balance < 0:
        raise ServiceError("The credit balance can't go below zero.", code=ErrorCode.CONFLICT)
    profile.credit_balance = balance
    profile.save(update_fields=["credit_balance"])
    return CreditMovement.objects.create(
        tenant_id=profile.tenant_id,
        kind=kind,
        amount=amount,
        balance_after=balance,
        description=description[:300],
        invoice=invoice,
        credit_note=credit_note,
        purchase=purchase,
        created_by=user,
    )
