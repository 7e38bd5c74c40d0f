"""Fixtures and helpers of the Stripe tests: the local Stripe-like API
(tests/fakes/stripe_api.py) with the real `stripe` library pointed at it, and webhook
deliveries signed the way Stripe signs them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

from django.test import Client
from django.urls import reverse

from billing.invoices.services import invoice_adjustment_add, invoice_draft_create, invoice_finalize
from billing.models import Invoice
from tests.fakes.stripe_api import FakeStripe, sign

WEBHOOK_SECRET = "whsec_test_gpugeek"
NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)


def fake_stripe_configured(settings) -> Iterator[FakeStripe]:
    """A started fake Stripe, configured as this console's Stripe (1 s client timeout).
    Test modules wrap it in their `stripe_api` fixture."""
    fake = FakeStripe().start()
    settings.STRIPE_API_KEY = fake.api_key
    settings.STRIPE_API_BASE = fake.url
    settings.STRIPE_TIMEOUT = 1
    try:
        yield fake
    finally:
        fake.stop()


def draft_with(tenant, *amounts: Decimal, start=NOV, end=DEC) -> Invoice:
    draft = invoice_draft_create(tenant=tenant, period_start=start, period_end=end)
    for amount in amounts:
        invoice_adjustment_add(
            invoice=draft, description=f"Fee {amount}", amount=amount, reason="test", user=None
        )
    return draft


def finalized_with(tenant, *amounts: Decimal, **period) -> Invoice:
    """An open invoice of adjustment lines (no Stripe key needed: nothing is queued
    unless one is set, and a non-transactional test never commits anyway)."""
    return invoice_finalize(invoice=draft_with(tenant, *amounts, **period), user=None)


def deliver(
    event: dict,
    *,
    secret: str = WEBHOOK_SECRET,
    timestamp: int | None = None,
    signature: str | None = None,
    client: Client | None = None,
):
    """POST `event` to the webhook as Stripe would: the raw JSON body, signed."""
    payload = json.dumps(event)
    headers = {}
    if signature is None:
        signature = sign(payload, secret, timestamp)
    if signature:
        headers["HTTP_STRIPE_SIGNATURE"] = signature
    # CSRF checks on, as for a real request: the endpoint is exempt (Stripe signs instead).
    return (client or Client(enforce_csrf_checks=True)).post(
        reverse("billing:stripe_webhook"), data=payload, content_type="application/json", **headers
    )
