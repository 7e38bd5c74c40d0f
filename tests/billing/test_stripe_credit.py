"""Prepaid credit through Stripe Checkout (against the local Stripe-like API), the credit
ledger and its pages and API, and tenant isolation of the payment pages."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from billing.credit_notes.services import credit_note_create
from billing.invoices.services import billing_profile_for, invoice_status_change
from billing.models import (
    CreditMovement,
    CreditMovementKind,
    CreditPack,
    CreditPurchase,
    CreditPurchaseStatus,
    InvoiceStatus,
)
from billing.payments import credits, stripe_sync
from console.service_errors import ServiceError
from tests.billing.stripe_helpers import (
    WEBHOOK_SECRET,
    deliver,
    fake_stripe_configured,
    finalized_with,
)
from tests.conftest import signed_in_client, token_client
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def stripe_api(settings):
    yield from fake_stripe_configured(settings)


@pytest.fixture
def webhook_secret(settings):
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET


def buy(client, pack):
    return client.post(reverse("billing:credit_buy"), {"pack": pack.pk})


def balance(tenant) -> Decimal:
    return billing_profile_for(tenant=tenant).credit_balance


def test_three_packs_are_seeded():
    assert CreditPack.objects.filter(active=True).count() == 3


def test_buying_credit_goes_to_checkout_and_the_completed_session_credits_once(
    world, stripe_api, webhook_secret
):
    pack = CreditPack.objects.order_by("amount").first()
    response = buy(signed_in_client(world.owner, world.tenant), pack)
    purchase = CreditPurchase.objects.get()
    (session,) = stripe_api.sessions.values()
    assert response.status_code == 302 and response["Location"] == session["url"]
    assert purchase.status == CreditPurchaseStatus.PENDING
    assert purchase.stripe_checkout_session_id == session["id"]
    assert session["metadata"]["gpugeek_tenant"] == str(world.tenant.pk)
    assert session["metadata"]["gpugeek_pack"] == str(pack.pk)
    assert session["client_reference_id"] == f"tenant-{world.tenant.pk}-purchase-{purchase.pk}"
    assert session["amount_total"] == int(pack.amount * 100)
    assert stripe_api.keys("/v1/checkout/sessions") == [purchase.idempotency_key]
    assert session["success_url"].endswith("/billing/credit/?checkout=success")

    completed = stripe_api.complete_session(session["id"])
    first = stripe_api.event("checkout.session.completed", completed)
    assert deliver(first).status_code == 200
    assert deliver(first).json()["duplicate"] is True  # the same event again
    # Another event saying the same (a resend under a new id): still credited once.
    assert deliver(stripe_api.event("checkout.session.completed", completed)).status_code == 200
    assert balance(world.tenant) == pack.amount
    (movement,) = CreditMovement.objects.filter(kind=CreditMovementKind.PURCHASE)
    assert movement.amount == pack.amount and movement.purchase == purchase
    purchase.refresh_from_db()
    assert purchase.status == CreditPurchaseStatus.PAID


def test_an_unpaid_or_mispriced_session_is_not_credited(
    world, stripe_api, webhook_secret, settings
):
    pack = CreditPack.objects.order_by("amount").first()
    buy(signed_in_client(world.owner, world.tenant), pack)
    (session,) = stripe_api.sessions.values()
    deliver(stripe_api.event("checkout.session.completed", session))  # still unpaid
    assert balance(world.tenant) == 0
    settings.STRIPE_API_KEY = ""  # the event's copy is what counts now
    cheap = {**stripe_api.complete_session(session["id"]), "amount_total": 1}
    deliver(stripe_api.event("checkout.session.completed", cheap))
    assert balance(world.tenant) == 0
    assert CreditPurchase.objects.get().status == CreditPurchaseStatus.PENDING


def test_a_session_event_before_its_id_was_saved_is_matched_by_metadata(
    world, other_world, stripe_api, webhook_secret
):
    pack = CreditPack.objects.order_by("amount").first()
    buy(signed_in_client(world.owner, world.tenant), pack)
    CreditPurchase.objects.update(stripe_checkout_session_id="")
    (session,) = stripe_api.sessions.values()
    completed = stripe_api.complete_session(session["id"])
    # Metadata naming another tenant than the purchase's matches nothing.
    wrong = {**completed, "id": "cs_other", "metadata": {**completed["metadata"]}}
    wrong["metadata"]["gpugeek_tenant"] = str(other_world.tenant.pk)
    deliver(stripe_api.event("checkout.session.completed", wrong))
    assert balance(world.tenant) == 0 and balance(other_world.tenant) == 0
    deliver(stripe_api.event("checkout.session.completed", completed))
    assert balance(world.tenant) == pack.amount


def test_without_a_key_buying_credit_says_so_and_creates_nothing(world, settings):
    settings.STRIPE_API_KEY = ""
    client = signed_in_client(world.owner, world.tenant)
    response = buy(client, CreditPack.objects.first())
    assert response.status_code == 302 and response["Location"] == reverse("billing:credit")
    assert not CreditPurchase.objects.exists()
    page = client.get(reverse("billing:credit")).content.decode()
    assert "no STRIPE_API_KEY" in page and 'data-testid="credit-not-configured"' in page


def test_stripe_unreachable_at_checkout_charges_nothing(world, stripe_api):
    stripe_api.fail_next(1, path="/v1/checkout")
    client = signed_in_client(world.owner, world.tenant)
    response = buy(client, CreditPack.objects.first())
    assert response["Location"] == reverse("billing:credit")
    page = client.get(response["Location"]).content.decode()
    assert "can&#x27;t be reached" in page or "can't be reached" in page
    assert stripe_api.sessions == {}


def test_credit_is_used_by_the_next_invoice_and_shown_at_stripe(world, stripe_api, webhook_secret):
    pack = CreditPack.objects.order_by("amount").first()  # 100.00
    buy(signed_in_client(world.owner, world.tenant), pack)
    (session,) = stripe_api.sessions.values()
    deliver(
        stripe_api.event("checkout.session.completed", stripe_api.complete_session(session["id"]))
    )
    invoice = finalized_with(world.tenant, Decimal("150"))
    assert invoice.credits_applied == Decimal("100.00") and invoice.amount_due == Decimal("50.00")
    assert balance(world.tenant) == 0
    used = CreditMovement.objects.get(kind=CreditMovementKind.INVOICE)
    assert used.amount == Decimal("-100.00") and used.invoice == invoice and used.balance_after == 0
    stripe_sync.invoice_push(invoice=invoice)
    stripe_invoice = stripe_api.invoices[invoice.stripe.stripe_invoice_id]
    assert stripe_invoice["total"] == 5000
    credit_items = [i for i in stripe_api.invoice_items.values() if i["amount"] < 0]
    assert [(i["description"], i["amount"]) for i in credit_items] == [
        ("Prepaid credit applied", -10000)
    ]


def test_credit_notes_write_the_ledger_too(world):
    invoice = finalized_with(world.tenant, Decimal("80"))
    invoice_status_change(to=InvoiceStatus.PAID, invoice=invoice, user=None)
    note = credit_note_create(invoice=invoice, reason="outage", amount=Decimal("30"), user=None)
    movement = CreditMovement.objects.get()
    assert movement.kind == CreditMovementKind.CREDIT_NOTE and movement.credit_note == note
    assert movement.amount == movement.balance_after == Decimal("30.00") == balance(world.tenant)


def test_credit_page_and_api_show_balance_and_history(world, other_world):
    invoice = finalized_with(world.tenant, Decimal("80"))
    invoice_status_change(to=InvoiceStatus.PAID, invoice=invoice, user=None)
    credit_note_create(invoice=invoice, reason="outage", amount=Decimal("30"), user=None)
    finance = signed_in_client(world.finance, world.tenant)
    listing = finance.get(reverse("billing:invoices")).content.decode()
    assert reverse("billing:credit") in listing
    page = finance.get(reverse("billing:credit")).content.decode()
    assert (
        ">30.00 USD<" in page and 'data-testid="credit-history"' in page and invoice.number in page
    )
    body = token_client(world.finance, world.tenant).get("/api/v1/credits").json()
    assert body["balance"] == "30.00" and body["count"] == 1
    (movement,) = body["results"]
    assert movement["kind"] == "credit_note" and movement["amount"] == "30.00"
    assert movement["invoice"] == invoice.number
    # Another organisation sees its own (empty) credit only.
    other = token_client(other_world.owner, other_world.tenant).get("/api/v1/credits").json()
    assert other == {"balance": "0.00", "count": 0, "next": None, "previous": None, "results": []}
    other_page = signed_in_client(other_world.owner, other_world.tenant).get(
        reverse("billing:credit")
    )
    assert invoice.number not in other_page.content.decode()
    assert 'data-testid="credit-history-empty"' in other_page.content.decode()


def test_roles_without_invoices_cannot_see_or_buy_credit(world, stripe_api):
    member = signed_in_client(world.member, world.tenant)
    assert member.get(reverse("billing:credit")).status_code == 403
    assert buy(member, CreditPack.objects.first()).status_code == 403
    assert token_client(world.member, world.tenant).get("/api/v1/credits").status_code == 403
    assert not CreditPurchase.objects.exists()


def test_another_tenants_invoice_with_its_stripe_link_is_404(world, other_world, stripe_api):
    foreign = finalized_with(other_world.tenant, Decimal("70"))
    stripe_sync.invoice_push(invoice=foreign)
    pay_url = foreign.stripe.hosted_invoice_url
    assert pay_url
    client = signed_in_client(world.owner, world.tenant)
    for name in ("billing:invoice_detail", "billing:invoice_lines_csv"):
        response = client.get(reverse(name, args=[foreign.pk]))
        assert response.status_code == 404
        assert pay_url not in response.content.decode()
    own_page = signed_in_client(other_world.owner, other_world.tenant).get(
        reverse("billing:invoice_detail", args=[foreign.pk])
    )
    assert pay_url in own_page.content.decode()


def test_buying_credit_is_for_the_signed_in_tenant_only(world, other_world, stripe_api):
    MembershipFactory(tenant=other_world.tenant, user=world.owner, role="owner")
    buy(signed_in_client(world.owner, world.tenant), CreditPack.objects.first())
    purchase = CreditPurchase.objects.get()
    assert purchase.tenant == world.tenant and purchase.created_by == world.owner
    assert not CreditPurchase.objects.for_tenant(other_world.tenant).exists()


@pytest.mark.parametrize("role", ["admin", "finance"])
def test_only_the_owner_buys_credit(world, stripe_api, role):
    client = signed_in_client(getattr(world, role), world.tenant)
    page = client.get(reverse("billing:credit")).content.decode()
    assert 'data-testid="credit-owner-only"' in page and "Pay with Stripe" not in page
    assert buy(client, CreditPack.objects.first()).status_code == 403
    with pytest.raises(ServiceError) as refused:
        credits.credit_checkout_start(
            tenant=world.tenant,
            pack=CreditPack.objects.first(),
            user=getattr(world, role),
            success_url="https://x.test/ok",
            cancel_url="https://x.test/",
        )
    assert refused.value.code == "forbidden"
    assert not CreditPurchase.objects.exists() and stripe_api.requests == []
    owner_page = signed_in_client(world.owner, world.tenant).get(reverse("billing:credit"))
    assert "Pay with Stripe" in owner_page.content.decode()


def test_an_inactive_or_unknown_pack_is_refused(world, stripe_api):
    pack = CreditPack.objects.first()
    CreditPack.objects.filter(pk=pack.pk).update(active=False)
    client = signed_in_client(world.owner, world.tenant)
    assert buy(client, pack)["Location"] == reverse("billing:credit")
    response = client.post(reverse("billing:credit_buy"), {"pack": "nope"})
    assert response["Location"] == reverse("billing:credit")
    assert not CreditPurchase.objects.exists() and stripe_api.requests == []
