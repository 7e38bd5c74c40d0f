"""Credit notes at Stripe (against the local Stripe-like API): a note made after its
invoice reached Stripe becomes a Stripe credit note, once, with a key from our number
stored before the first call; a note made before is billed by the Stripe invoice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.credit_notes.services import credit_note_create
from billing.invoices.services import invoice_status_change
from billing.models import CreditMovementKind, InvoiceStatus, StripeCreditNote
from billing.payments import stripe_sync
from billing.payments.client import StripeUnavailable
from console.celery import app as celery_app
from tests.billing.conftest import give_credit
from tests.billing.stripe_helpers import fake_stripe_configured, finalized_with

pytestmark = pytest.mark.django_db


@pytest.fixture
def stripe_api(settings):
    yield from fake_stripe_configured(settings)


def at_stripe(world, amount="100"):
    invoice = finalized_with(world.tenant, Decimal(amount))
    stripe_sync.invoice_push(invoice=invoice)
    return invoice


def credit(invoice, amount):
    return credit_note_create(
        invoice=invoice, reason="GPU outage", amount=Decimal(amount), user=None
    )


def test_a_note_on_an_open_invoice_at_stripe_lowers_what_stripe_collects(
    world, stripe_api, settings
):
    invoice = at_stripe(world)
    note = credit(invoice, "25.00")

    pushed = stripe_sync.credit_note_push(credit_note=note)

    (made,) = stripe_api.credit_notes.values()
    key = f"gpugeek:{settings.GPUGEEK_INSTALLATION_ID}:credit-note:{note.number}"
    assert stripe_api.keys("/v1/credit_notes") == [key] == [pushed.idempotency_key]
    assert made["invoice"] == invoice.stripe.stripe_invoice_id
    assert (made["amount"], made["type"], made["out_of_band_amount"]) == (2500, "pre_payment", None)
    assert made["metadata"]["gpugeek_credit_note"] == note.number
    assert pushed.stripe_credit_note_id == made["id"] and pushed.sent_at is not None
    assert stripe_api.invoices[made["invoice"]]["amount_remaining"] == 7500
    before = len(stripe_api.requests)
    stripe_sync.credit_note_push(credit_note=note)  # a duplicate task: nothing sent
    assert len(stripe_api.requests) == before


def test_a_note_on_a_paid_invoice_is_credited_out_of_band(world, stripe_api):
    invoice = at_stripe(world)
    stripe_api.pay_invoice(invoice.stripe.stripe_invoice_id)
    invoice_status_change(
        invoice=invoice, to=InvoiceStatus.PAID, user=None, via="stripe", reference="in_paid"
    )
    note = credit(invoice, "30.00")  # GpuGeek credit now, not a lower amount due

    stripe_sync.credit_note_push(credit_note=note)

    (made,) = stripe_api.credit_notes.values()
    assert (made["amount"], made["out_of_band_amount"], made["type"]) == (
        3000,
        3000,
        "post_payment",
    )


def test_only_what_lowered_the_amount_due_goes_to_stripe(world, stripe_api):
    give_credit(world.tenant, "40.00", CreditMovementKind.PURCHASE)
    invoice = at_stripe(world)  # 100, of which prepaid credit paid 40: Stripe bills 60
    # 60 are left to pay: 60 lower it, the other 20 become GpuGeek credit again.
    note = credit(invoice, "80.00")
    assert (note.reduced_amount_due, note.credited_to_balance) == (Decimal(60), Decimal(20))

    stripe_sync.credit_note_push(credit_note=note)

    (made,) = stripe_api.credit_notes.values()
    assert made["amount"] == 6000 and made["type"] == "pre_payment"
    assert stripe_api.invoices[invoice.stripe.stripe_invoice_id]["status"] == "paid"


@pytest.mark.parametrize("fault", ["timeout", "outage"])
def test_a_retry_after_a_timeout_or_outage_makes_one_stripe_credit_note(world, stripe_api, fault):
    note = credit(at_stripe(world), "20.00")
    if fault == "timeout":  # Stripe made it, the answer was lost
        stripe_api.timeout_next(1, path="/v1/credit_notes")
    else:
        stripe_api.fail_next(1, path="/v1/credit_notes")

    with pytest.raises(StripeUnavailable):
        stripe_sync.credit_note_push(credit_note=note)
    pushed = StripeCreditNote.objects.get(credit_note=note)
    assert pushed.sent_at is None and pushed.attempts == 1 and pushed.last_error
    assert pushed.idempotency_key.endswith(f":credit-note:{note.number}")  # stored first

    pushed = stripe_sync.credit_note_push(credit_note=note)

    assert len(stripe_api.credit_notes) == 1
    assert pushed.sent_at is not None and pushed.last_error == ""
    (made,) = stripe_api.credit_notes.values()
    assert pushed.stripe_credit_note_id == made["id"]
    assert len(set(stripe_api.keys("/v1/credit_notes"))) == 1
    expected = ["delayed", "replayed"] if fault == "timeout" else ["failed", "executed"]
    assert [r.outcome for r in stripe_api.posts("/v1/credit_notes")] == expected


def test_a_note_made_before_the_push_is_billed_by_the_stripe_invoice(world, stripe_api):
    invoice = finalized_with(world.tenant, Decimal("100"))
    note = credit(invoice, "40.00")
    assert stripe_sync.credit_note_push(credit_note=note) is None  # not at Stripe yet

    stripe_sync.invoice_push(invoice=invoice)
    pushed = stripe_sync.credit_note_push(credit_note=note)

    assert pushed.in_invoice and stripe_api.posts("/v1/credit_notes") == []
    (stripe_invoice,) = stripe_api.invoices.values()
    assert stripe_invoice["total"] == 6000  # the "Credit notes" item took it off
    assert stripe_sync.credit_notes_awaiting_push(now=datetime.now(UTC) + timedelta(days=1)) == []


def test_a_note_waits_while_its_invoice_is_on_its_way_to_stripe(world, stripe_api):
    invoice = finalized_with(world.tenant, Decimal("100"))
    stripe_api.fail_next(1, path="/v1/invoices")
    with pytest.raises(StripeUnavailable):
        stripe_sync.invoice_push(invoice=invoice)  # planned, not sent
    note = credit(invoice, "10.00")

    with pytest.raises(stripe_sync.InvoiceNotYetAtStripe):
        stripe_sync.credit_note_push(credit_note=note)
    stripe_sync.invoice_push(invoice=invoice)  # its items were planned before the note
    stripe_sync.credit_note_push(credit_note=note)

    (stripe_invoice,) = stripe_api.invoices.values()
    (made,) = stripe_api.credit_notes.values()
    assert stripe_invoice["total"] == 10000 and made["amount"] == 1000
    assert stripe_invoice["amount_remaining"] == 9000


def test_creating_a_note_queues_its_push_after_commit(
    world, stripe_api, tasks_in_process, django_capture_on_commit_callbacks
):
    invoice = at_stripe(world)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        credit(invoice, "5.00")
        assert stripe_api.posts("/v1/credit_notes") == []
    assert len(callbacks) == 1
    assert len(stripe_api.credit_notes) == 1
    task = celery_app.tasks["billing.tasks.credit_note_push_to_stripe"]
    assert task.autoretry_for == (StripeUnavailable,) and task.acks_late and task.max_retries


def test_lost_note_pushes_are_found_by_the_reconciler(world, stripe_api):
    note = credit(at_stripe(world), "5.00")
    now = datetime.now(UTC)
    assert stripe_sync.credit_notes_awaiting_push(now=now) == []  # its task may still run
    assert stripe_sync.credit_notes_awaiting_push(now=now + timedelta(hours=1)) == [note.pk]
    stripe_api.fail_next(1, path="/v1/credit_notes")
    with pytest.raises(StripeUnavailable):
        stripe_sync.credit_note_push(credit_note=note)
    assert stripe_sync.credit_notes_awaiting_push(now=now) == []  # tried just now
    assert stripe_sync.credit_notes_awaiting_push(now=now + timedelta(hours=2)) == [note.pk]
    stripe_sync.credit_note_push(credit_note=note)
    assert stripe_sync.credit_notes_awaiting_push(now=now + timedelta(days=1)) == []


def test_without_a_key_nothing_is_sent(world, settings):
    settings.STRIPE_API_KEY = ""
    note = credit(finalized_with(world.tenant, Decimal("100")), "5.00")
    assert stripe_sync.credit_note_push(credit_note=note) is None
    assert not StripeCreditNote.objects.exists()
