"""Prepaid credit bought through Stripe Checkout.

A purchase row (with a fresh idempotency key) is written and committed before the
Checkout Session is created, so a retried creation can't make a second session for it;
the tenant is sent to the session's URL. When Stripe reports the session paid
(`checkout.session.completed`, see `webhook.py`), `credit_purchase_complete` adds the
pack's amount to the tenant's balance exactly once: the purchase row is locked and
checked, and the credit ledger allows one movement per purchase (a unique constraint).
Invoices use the balance first when they are finalized (`invoicing._totals`).
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from decimal import Decimal

from django.db import transaction

from billing.credit_notes.ledger import credit_balance_move
from billing.invoices.services import billing_profile_for
from billing.models import (
    CreditMovementKind,
    CreditPack,
    CreditPurchase,
    CreditPurchaseStatus,
)
from billing.payments.client import (
    StripeRefused,
    StripeUnavailable,
    idempotency_key,
    installation_metadata,
    stripe_call,
    stripe_configured,
)
from billing.payments.selectors import credit_required_before_launch
from billing.payments.stripe_sync import stripe_customer_for
from console.models import Tenant, User
from console.permissions import Capability, has_capability
from console.selectors import membership_of
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from jobs.services import JobSpec

log = logging.getLogger(__name__)

NOT_CONFIGURED = (
    "Buying credit needs Stripe, and this installation has no STRIPE_API_KEY. "
    "Ask platform staff to add credit for you."
)
ONLY_OWNER = "Only the organisation's owner can buy credit."


def credit_checkout_start(
    *, tenant: Tenant, pack: CreditPack, user: User, success_url: str, cancel_url: str
) -> CreditPurchase:
    """A purchase of `pack` and its Stripe Checkout Session; the caller redirects the
    user to `purchase.checkout_url`. Without a Stripe key nothing is created.

    Only a member with the buy-credit capability (the owner) may spend the
    organisation's money; checked here too, whoever calls."""
    membership = membership_of(user=user, tenant=tenant)
    if not has_capability(membership, Capability.BUY_CREDIT):
        raise ServiceError(ONLY_OWNER, code=ErrorCode.FORBIDDEN)
    if not stripe_configured():
        raise ServiceError(NOT_CONFIGURED, code=ErrorCode.CONFLICT)
    if not pack.active:
        raise ServiceError("This credit pack is no longer offered.", field="pack")
    purchase = CreditPurchase.objects.create(
        tenant=tenant,
        pack=pack,
        amount=pack.amount,
        currency=pack.currency,
        idempotency_key=idempotency_key("credit-purchase", uuid.uuid4().hex),
        created_by=user,
    )
    audit_record(
        action="credit.checkout_start",
        tenant=tenant,
        actor=user,
        target=purchase,
        metadata={"pack": pack.name, "amount": str(pack.amount), "currency": pack.currency},
    )
    metadata = {
        **installation_metadata(),
        "gpugeek_tenant": str(tenant.pk),
        "gpugeek_pack": str(pack.pk),
        "gpugeek_purchase": str(purchase.pk),
    }
    try:
        customer = stripe_customer_for(tenant=tenant)
        session = stripe_call(
            lambda client: client.v1.checkout.sessions.create(
                params={
                    "mode": "payment",
                    "customer": customer,
                    "client_reference_id": f"tenant-{tenant.pk}-purchase-{purchase.pk}",
                    "metadata": metadata,
                    "payment_intent_data": {"metadata": metadata},
                    "line_items": [
                        {
                            "quantity": 1,
                            "price_data": {
                                "currency": pack.currency.lower(),
                                "unit_amount": int(pack.amount * 100),
                                "product_data": {"name": f"GpuGeek credit: {pack.name}"},
                            },
                        }
                    ],
                    "success_url": success_url,
                    "cancel_url": cancel_url,
                },
                options={"idempotency_key": purchase.idempotency_key},
            )
        )
    except StripeUnavailable:
        raise ServiceError(
            "Stripe can't be reached right now; nothing was charged. Try again in a minute.",
            code=ErrorCode.CONFLICT,
        ) from None
    except StripeRefused as error:
        log.error("Stripe refused a checkout session for %s: %s", tenant.slug, error)
        raise ServiceError("Stripe refused to start the payment; nothing was charged.") from None
    CreditPurchase.objects.filter(pk=purchase.pk).update(
        stripe_checkout_session_id=session.id, checkout_url=session.url or ""
    )
    purchase.refresh_from_db()
    return purchase


def credit_purchase_complete(
    *, purchase: CreditPurchase, amount_paid: Decimal | None, currency: str, reference: str
) -> bool:
    """Credit a paid purchase to its tenant, once. False when already credited (a
    duplicate or late event) or when what Stripe collected isn't the purchase's price."""
    with transaction.atomic():
        profile = billing_profile_for(tenant=purchase.tenant, lock=True)
        locked = CreditPurchase.objects.select_for_update().get(pk=purchase.pk)
        if locked.status == CreditPurchaseStatus.PAID:
            return False
        if amount_paid is not None and (
            amount_paid != locked.amount or currency.upper() != locked.currency.upper()
        ):
            log.error(
                "checkout %s paid %s %s for a purchase of %s %s: not credited",
                reference, amount_paid, currency, locked.amount, locked.currency,
            )  # fmt: skip
            return False
        locked.status, locked.paid_at = CreditPurchaseStatus.PAID, datetime.now(UTC)
        locked.save(update_fields=["status", "paid_at"])
        credit_balance_move(
            profile=profile,
            amount=locked.amount,
            kind=CreditMovementKind.PURCHASE,
            description=f"Prepaid credit: {locked.pack.name}",
            purchase=locked,
        )
        audit_record(
            action="credit.purchase_paid",
            tenant=locked.tenant,
            actor_label="stripe",
            target=locked,
            metadata={"amount": str(locked.amount), "reference": reference},
        )
    return True


class CreditLaunchPolicy:
    """jobs.extensions.LaunchPolicy: under the policy for new organisations, one without
    credit or a paid invoice adds credit before its first launch (402)."""

    def check_launch(self, *, tenant: Tenant, spec: JobSpec) -> None:
        if credit_required_before_launch(tenant=tenant):
            raise ServiceError(
                "Add credit before this organisation's first launch (Billing → Credit); "
                "nothing is charged until a job runs.",
                code=ErrorCode.PAYMENT_REQUIRED,
            )
