"""Stripe, against a local Stripe-like API (tests/fakes/stripe_api.py) driven by the real
`stripe` library: invoices pushed with stored idempotency keys (timeouts and outages
retried without duplicates), and webhooks verified, stored once and applied in any order."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from billing import tasks as billing_tasks
from billing.invoices.services import (
    billing_profile_for,
    invoice_finalize,
    invoice_status_change,
)
from billing.models import (
    Invoice,
    InvoiceStatus,
    StripeEvent,
    StripeInvoice,
    StripeInvoiceItem,
)
from billing.payments import stripe_sync
from billing.payments.client import StripeUnavailable
from console.celery import app as celery_app
from console.models import AuditEvent
from console.queueing import enqueue_now
from tests.billing.stripe_helpers import (
    DEC,
    WEBHOOK_SECRET,
    deliver,
    draft_with,
    fake_stripe_configured,
    finalized_with,
)
from tests.broker import broker_replaced
from tests.concurrency import run_at_once
from tests.conftest import signed_in_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def stripe_api(settings):
    yield from fake_stripe_configured(settings)


@pytest.fixture
def webhook_secret(settings):
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET


def pushed_invoice(tenant, stripe_api, *amounts):
    invoice = finalized_with(tenant, *(amounts or (Decimal("120"),)))
    stripe_sync.invoice_push(invoice=invoice)
    return invoice, invoice.stripe.stripe_invoice_id


# --- pushing invoices ---


def test_push_creates_customer_items_and_invoice_with_keys_from_number_and_lines(
    world, stripe_api, settings
):
    profile = billing_profile_for(tenant=world.tenant)
    profile.tax_rate_percent, profile.tax_label = Decimal("19"), "VAT"
    profile.save()
    invoice = finalized_with(world.tenant, Decimal("10.004"), Decimal("0.333333333"))
    pushed = stripe_sync.invoice_push(invoice=invoice)

    (customer,) = stripe_api.customers.values()
    assert customer["metadata"]["gpugeek_tenant"] == str(world.tenant.pk)
    assert billing_profile_for(tenant=world.tenant).stripe_customer_id == customer["id"]
    (stripe_invoice,) = stripe_api.invoices.values()
    assert pushed.stripe_invoice_id == stripe_invoice["id"] and stripe_invoice["status"] == "open"
    assert pushed.hosted_invoice_url == stripe_invoice["hosted_invoice_url"]
    assert pushed.sent_at is not None and pushed.last_error == ""
    assert stripe_invoice["metadata"]["gpugeek_number"] == invoice.number
    # Lines, tax and rounding are items; they sum to our amount due, in cents.
    assert stripe_invoice["total"] == int(invoice.amount_due * 100)
    assert len(stripe_api.invoice_items) == 4  # two lines, tax, rounding
    prefix = f"gpugeek:{settings.GPUGEEK_INSTALLATION_ID}:invoice:{invoice.number}"
    line_ids = list(invoice.lines.values_list("pk", flat=True))
    assert stripe_api.keys("/v1/invoiceitems") == [
        *(f"{prefix}:line:{pk}" for pk in line_ids),
        f"{prefix}:tax",
        f"{prefix}:rounding",
    ]
    assert stripe_api.keys("/v1/invoices") == [prefix, f"{prefix}:finalize"]
    # The keys sent are the ones stored on our rows.
    assert set(StripeInvoiceItem.objects.values_list("idempotency_key", flat=True)) == set(
        stripe_api.keys("/v1/invoiceitems")
    )
    # Pushing again (a duplicate task) calls Stripe no more.
    before = len(stripe_api.requests)
    stripe_sync.invoice_push(invoice=invoice)
    assert len(stripe_api.requests) == before


def test_keys_are_stored_before_the_first_call(world, stripe_api):
    invoice = finalized_with(world.tenant, Decimal("50"))
    stripe_api.fail_next(1, path="/v1/customers")
    with pytest.raises(StripeUnavailable):
        stripe_sync.invoice_push(invoice=invoice)
    pushed = StripeInvoice.objects.get(invoice=invoice)
    assert pushed.idempotency_key.endswith(f":invoice:{invoice.number}")
    assert pushed.items.count() == 1 and pushed.attempts == 1 and "HTTP 500" in pushed.last_error
    assert billing_profile_for(tenant=world.tenant).stripe_customer_idempotency_key
    assert stripe_api.customers == {}  # the 500 came before Stripe executed anything


@pytest.mark.parametrize("path", ["/v1/customers", "/v1/invoices", "/v1/invoiceitems", "/finalize"])
def test_timeout_after_the_request_was_received_then_retry_makes_no_duplicate(
    world, stripe_api, path
):
    invoice = finalized_with(world.tenant, Decimal("70"), Decimal("5"))
    if path == "/finalize":  # the finalize request: time out that one
        stripe_api.timeout_next(1, path="/v1/invoices/in_")
    else:
        stripe_api.timeout_next(1, path=path)
    with pytest.raises(StripeUnavailable):
        stripe_sync.invoice_push(invoice=invoice)
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.OPEN
    assert StripeInvoice.objects.get(invoice=invoice).sent_at is None
    pushed = stripe_sync.invoice_push(invoice=invoice)  # the retry
    assert pushed.sent_at is not None
    assert len(stripe_api.customers) == 1 and len(stripe_api.invoices) == 1
    assert len(stripe_api.invoice_items) == 2
    timed_out = [r for r in stripe_api.requests if r.outcome == "delayed"]
    replayed = [r for r in stripe_api.requests if r.outcome == "replayed"]
    assert len(timed_out) == 1 and len(replayed) == 1
    assert replayed[0].idempotency_key == timed_out[0].idempotency_key
    (stripe_invoice,) = stripe_api.invoices.values()
    assert stripe_invoice["status"] == "open" and stripe_invoice["total"] == 7500


def test_finalizing_queues_the_push_after_commit(
    world, stripe_api, tasks_in_process, django_capture_on_commit_callbacks
):
    draft = draft_with(world.tenant, Decimal("42"))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        invoice = invoice_finalize(invoice=draft, user=world.owner)
        assert stripe_api.requests == []  # nothing is sent before the commit
    assert len(callbacks) == 1
    assert StripeInvoice.objects.get(invoice=invoice).sent_at is not None
    page = signed_in_client(world.finance, world.tenant).get(
        reverse("billing:invoice_detail", args=[invoice.pk])
    )
    assert 'data-testid="pay-online"' in page.content.decode()
    assert invoice.stripe.hosted_invoice_url in page.content.decode()


@pytest.fixture
def tasks_retried_in_process(monkeypatch):
    """Tasks queued by name run in-process like `tasks_in_process`, but errors are not
    thrown at the caller: Celery's eager apply then runs each retry at once (no
    countdown), as a worker would run them after their backoff."""
    results = []

    def run_in_process(task, args, countdown):
        results.append(task.apply(args=args))
        return results[-1]

    broker_replaced(monkeypatch, run_in_process)
    return results


def test_push_task_retries_with_backoff():
    task = celery_app.tasks["billing.tasks.invoice_push_to_stripe"]
    assert task.autoretry_for == (StripeUnavailable,) and task.retry_backoff
    assert task.acks_late and task.max_retries


def test_stripe_unreachable_keeps_the_invoice_open_and_the_task_retries_with_the_same_keys(
    world, stripe_api, tasks_retried_in_process, django_capture_on_commit_callbacks
):
    draft = draft_with(world.tenant, Decimal("42"))
    stripe_api.fail_next(2, path="/v1/customers")
    stripe_api.fail_next(3, path="/v1/invoices")
    with django_capture_on_commit_callbacks(execute=True):
        invoice = invoice_finalize(invoice=draft, user=None)
    # Eager apply runs each Celery retry at once: 2 + 3 failures, then the push went through.
    assert [result.state for result in tasks_retried_in_process] == ["SUCCESS"]
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.OPEN
    pushed = StripeInvoice.objects.get(invoice=invoice)
    assert pushed.sent_at is not None and pushed.attempts == 6
    invoice_posts = [r for r in stripe_api.posts("/v1/invoices") if "finalize" not in r.path]
    assert [r.outcome for r in invoice_posts] == ["failed"] * 3 + ["executed"]
    assert len({r.idempotency_key for r in invoice_posts}) == 1
    assert len({r.idempotency_key for r in stripe_api.posts("/v1/customers")}) == 1
    assert len(stripe_api.invoices) == 1 and len(stripe_api.customers) == 1


def test_stripe_down_for_good_the_page_says_not_yet_sent(
    world, stripe_api, tasks_retried_in_process
):
    invoice = finalized_with(world.tenant, Decimal("42"))
    stripe_api.fail_next(100)
    enqueue_now(billing_tasks.invoice_push_to_stripe, invoice.pk)
    (result,) = tasks_retried_in_process
    assert result.state == "FAILURE" and isinstance(result.result, StripeUnavailable)
    assert len(stripe_api.requests) == 17  # the first try and 16 retries, then it gives up
    assert len({r.idempotency_key for r in stripe_api.requests}) == 1
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.OPEN
    page = signed_in_client(world.owner, world.tenant).get(
        reverse("billing:invoice_detail", args=[invoice.pk])
    )
    assert "not yet sent to Stripe" in page.content.decode()
    # The reconciler queues it again once no push has tried for an hour.
    now = datetime.now(UTC)
    assert stripe_sync.invoices_awaiting_push(now=now) == []
    assert stripe_sync.invoices_awaiting_push(now=now + timedelta(hours=2)) == [invoice.pk]


def test_without_a_key_nothing_is_pushed_and_the_page_says_so(world, settings):
    settings.STRIPE_API_KEY = ""
    invoice = finalized_with(world.tenant, Decimal("42"))
    assert stripe_sync.invoice_push(invoice=invoice) is None
    assert not StripeInvoice.objects.exists()
    page = signed_in_client(world.owner, world.tenant).get(
        reverse("billing:invoice_detail", args=[invoice.pk])
    )
    assert "Invoices are not synced to Stripe (no STRIPE_API_KEY)" in page.content.decode()


def test_an_invoice_settled_by_credit_or_paid_locally_is_not_pushed(world, stripe_api):
    invoice = finalized_with(world.tenant, Decimal("42"))
    invoice_status_change(to=InvoiceStatus.PAID, invoice=invoice, user=world.owner)
    assert stripe_sync.invoice_push(invoice=invoice) is None
    assert stripe_api.requests == []


# --- webhooks: signatures ---


def _nothing_written(invoice, audit_before):
    invoice.refresh_from_db()
    return (
        not StripeEvent.objects.exists()
        and invoice.status == InvoiceStatus.OPEN
        and AuditEvent.objects.count() == audit_before
    )


@pytest.mark.parametrize(
    "case", ["bad signature", "wrong secret", "missing header", "stale timestamp", "not json"]
)
def test_unverified_webhooks_are_400_and_write_nothing(world, stripe_api, webhook_secret, case):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    event = stripe_api.event("invoice.paid", stripe_api.pay_invoice(stripe_id))
    audit_before = AuditEvent.objects.count()
    if case == "bad signature":
        response = deliver(event, signature=f"t={int(time.time())},v1={'0' * 64}")
    elif case == "wrong secret":
        response = deliver(event, secret="whsec_someone_else")
    elif case == "missing header":
        response = deliver(event, signature="")
    elif case == "stale timestamp":
        response = deliver(event, timestamp=int(time.time()) - 301)
    else:
        response = Client().post(
            reverse("billing:stripe_webhook"),
            data=b"\xff not json",
            content_type="application/json",
            HTTP_STRIPE_SIGNATURE="t=1,v1=00",
        )
    assert response.status_code == 400
    assert response.json()["detail"]
    assert _nothing_written(invoice, audit_before)


def test_webhooks_without_a_configured_secret_are_refused(world, stripe_api, settings):
    settings.STRIPE_WEBHOOK_SECRET = ""
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    event = stripe_api.event("invoice.paid", stripe_api.pay_invoice(stripe_id))
    audit_before = AuditEvent.objects.count()
    response = deliver(event, secret="")
    assert response.status_code == 400 and "STRIPE_WEBHOOK_SECRET" in response.json()["detail"]
    assert _nothing_written(invoice, audit_before)


def test_a_signature_just_inside_the_tolerance_is_accepted(world, stripe_api, webhook_secret):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    event = stripe_api.event("invoice.paid", stripe_api.pay_invoice(stripe_id))
    assert deliver(event, timestamp=int(time.time()) - 290).status_code == 200
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID


def test_get_is_not_allowed_and_unknown_events_are_acknowledged(world, stripe_api, webhook_secret):
    assert Client().get(reverse("billing:stripe_webhook")).status_code == 405
    response = deliver(stripe_api.event("customer.created", {"id": "cus_x", "object": "customer"}))
    assert response.status_code == 200
    assert StripeEvent.objects.get().outcome.startswith("ignored")


# --- webhooks: duplicates and order ---


@pytest.mark.django_db(transaction=True)
def test_ten_concurrent_duplicates_change_the_invoice_once(
    world, stripe_api, webhook_secret, settings
):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    event = stripe_api.event("invoice.paid", stripe_api.pay_invoice(stripe_id))
    statuses = []

    def deliver_once():
        response = deliver(event)
        statuses.append((response.status_code, response.json()["duplicate"]))

    if connection.vendor == "postgresql":
        # Stripe answers the ten re-reads together: every delivery passes the "seen it?"
        # check before any is stored, so all ten race for the event's row.
        stripe_api.answer_together(10, path=f"/v1/invoices/{stripe_id}")
        settings.STRIPE_TIMEOUT = 30  # a loaded machine may start the ten seconds apart
        run_at_once(deliver_once, copies=10)
    else:  # SQLite serialises writers: the same ten deliveries, one after another
        for _ in range(10):
            deliver_once()
    assert sorted(statuses) == [(200, False)] + [(200, True)] * 9
    if connection.vendor == "postgresql":
        assert sum(r.outcome == "held" for r in stripe_api.requests) == 10
    assert StripeEvent.objects.filter(event_id=event["id"]).count() == 1
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID
    assert AuditEvent.objects.filter(action="invoice.paid", target_id=str(invoice.pk)).count() == 1


LIFECYCLE = ["invoice.finalized", "invoice.payment_failed", "invoice.paid"]


@pytest.mark.parametrize("reread", [True, False], ids=["re-read from Stripe", "event copies"])
@pytest.mark.parametrize("order", list(itertools.permutations(LIFECYCLE)), ids="→".join)
def test_every_order_of_the_lifecycle_ends_paid(
    world, stripe_api, webhook_secret, settings, order, reread
):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    # What happened at Stripe, with the event each step sent (a snapshot of that moment).
    events = {
        "invoice.finalized": stripe_api.event("invoice.finalized", stripe_api.invoices[stripe_id])
    }
    events["invoice.payment_failed"] = stripe_api.event(
        "invoice.payment_failed", stripe_api.fail_invoice_payment(stripe_id)
    )
    events["invoice.paid"] = stripe_api.event("invoice.paid", stripe_api.pay_invoice(stripe_id))
    if not reread:
        settings.STRIPE_API_KEY = ""  # forward-only transitions from the events' copies
    for event_type in order:
        assert deliver(events[event_type]).status_code == 200
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID
    assert StripeEvent.objects.count() == 3
    assert AuditEvent.objects.filter(action="invoice.paid").count() == 1
    # A failure is recorded only if it arrived while the invoice was still open.
    failed_first = order.index("invoice.payment_failed") < order.index("invoice.paid")
    assert (invoice.payment_failed_at is not None) == (failed_first and not reread)


@pytest.mark.parametrize("reread", [True, False], ids=["re-read from Stripe", "event copies"])
def test_voided_after_paid_stays_paid(world, stripe_api, webhook_secret, settings, reread):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    paid = stripe_api.event("invoice.paid", stripe_api.pay_invoice(stripe_id))
    voided_copy = {**stripe_api.invoices[stripe_id], "status": "void"}
    voided = stripe_api.event("invoice.voided", voided_copy)
    if not reread:
        settings.STRIPE_API_KEY = ""
    assert deliver(paid).status_code == 200
    assert deliver(voided).status_code == 200
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID and invoice.voided_at is None
    assert "kept paid" in StripeEvent.objects.get(event_id=voided["id"]).outcome


def test_voided_and_uncollectible_apply_to_an_open_invoice(world, stripe_api, webhook_secret):
    first, first_id = pushed_invoice(world.tenant, stripe_api)
    deliver(stripe_api.event("invoice.voided", stripe_api.void_invoice(first_id)))
    first.refresh_from_db()
    assert first.status == InvoiceStatus.VOID
    audit = AuditEvent.objects.get(action="invoice.void")
    assert audit.actor_label == "stripe" and audit.metadata["via"] == "stripe"
    second = finalized_with(
        world.tenant, Decimal("9"), start=DEC, end=DEC.replace(month=12, day=31)
    )
    stripe_sync.invoice_push(invoice=second)
    second_id = second.stripe.stripe_invoice_id
    deliver(
        stripe_api.event("invoice.marked_uncollectible", stripe_api.mark_uncollectible(second_id))
    )
    second.refresh_from_db()
    assert second.status == InvoiceStatus.UNCOLLECTIBLE
    # Uncollectible → paid is still a forward transition.
    deliver(stripe_api.event("invoice.paid", stripe_api.pay_invoice(second_id)))
    second.refresh_from_db()
    assert second.status == InvoiceStatus.PAID


def test_an_event_before_our_push_saved_the_id_is_matched_by_metadata(
    world, stripe_api, webhook_secret
):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    StripeInvoice.objects.filter(invoice=invoice).update(stripe_invoice_id="")
    deliver(stripe_api.event("invoice.paid", stripe_api.pay_invoice(stripe_id)))
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID
    assert StripeInvoice.objects.get(invoice=invoice).stripe_invoice_id == stripe_id


def test_another_installations_invoice_is_ignored(world, stripe_api, webhook_secret, settings):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    foreign = {**stripe_api.pay_invoice(stripe_id), "id": "in_elsewhere"}
    foreign["metadata"] = {**foreign["metadata"], "gpugeek_installation": "gg-another"}
    settings.STRIPE_API_KEY = ""  # no re-read: only the event's metadata could match
    assert deliver(stripe_api.event("invoice.paid", foreign)).status_code == 200
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.OPEN


def test_payment_failure_shows_on_the_invoice_and_the_dashboard(
    world, other_world, stripe_api, webhook_secret
):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    deliver(stripe_api.event("invoice.payment_failed", stripe_api.fail_invoice_payment(stripe_id)))
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.OPEN and invoice.payment_failed_at is not None
    finance = signed_in_client(world.finance, world.tenant)
    page = finance.get(reverse("billing:invoice_detail", args=[invoice.pk])).content.decode()
    assert 'data-testid="payment-failed"' in page and "could not collect" in page
    dashboard = finance.get(reverse("dashboard")).content.decode()
    assert 'data-testid="dashboard-payment-failed"' in dashboard and invoice.number in dashboard
    # Not for roles that don't see invoices, nor for another organisation.
    viewer = signed_in_client(world.viewer, world.tenant).get(reverse("dashboard"))
    assert 'data-testid="dashboard-payment-failed"' not in viewer.content.decode()
    other = signed_in_client(other_world.owner, other_world.tenant).get(reverse("dashboard"))
    assert invoice.number not in other.content.decode()
    # Once paid, the failure is history: no banner.
    deliver(stripe_api.event("invoice.paid", stripe_api.pay_invoice(stripe_id)))
    dashboard = finance.get(reverse("dashboard")).content.decode()
    assert 'data-testid="dashboard-payment-failed"' not in dashboard


def test_webhook_answers_json_without_a_session_and_says_duplicate(
    world, stripe_api, webhook_secret
):
    _invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    event = stripe_api.event("invoice.paid", stripe_api.pay_invoice(stripe_id))
    response = deliver(event)
    body = response.json()
    assert body == {"received": True, "event": event["id"], "duplicate": False}
    assert "sessionid" not in response.cookies and "csrftoken" not in response.cookies
    assert deliver(event).json()["duplicate"] is True


def test_lost_pushes_are_found_by_the_reconciler(world, stripe_api):
    lost = finalized_with(world.tenant, Decimal("42"))
    Invoice.objects.filter(pk=lost.pk).update(finalized_at=datetime.now(UTC) - timedelta(hours=1))
    assert stripe_sync.invoices_awaiting_push(now=datetime.now(UTC)) == [lost.pk]
    stripe_sync.invoice_push(invoice=lost)
    assert stripe_sync.invoices_awaiting_push(now=datetime.now(UTC) + timedelta(days=1)) == []


# --- changes made here follow to Stripe ---


@pytest.mark.parametrize(
    ("change", "stripe_status"),
    [
        (InvoiceStatus.VOID, "void"),
        (InvoiceStatus.UNCOLLECTIBLE, "uncollectible"),
        (InvoiceStatus.PAID, "paid"),
    ],
    ids=["void", "uncollectible", "paid out of band"],
)
def test_a_staff_change_is_carried_to_the_stripe_invoice(
    world, stripe_api, tasks_in_process, django_capture_on_commit_callbacks, change, stripe_status
):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    with django_capture_on_commit_callbacks(execute=True):
        invoice_status_change(invoice=invoice, to=change, user=world.owner)
    assert stripe_api.invoices[stripe_id]["status"] == stripe_status
    (call,) = [
        r for r in stripe_api.posts(f"/v1/invoices/{stripe_id}/") if "finalize" not in r.path
    ]
    assert call.idempotency_key.endswith(f":invoice:{invoice.number}:{call.path.rsplit('/', 1)[1]}")


def test_a_change_reported_by_stripe_is_not_sent_back(
    world, stripe_api, webhook_secret, tasks_in_process, django_capture_on_commit_callbacks
):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    event = stripe_api.event("invoice.voided", stripe_api.void_invoice(stripe_id))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        deliver(event)
    assert callbacks == []
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.VOID


def test_voiding_here_what_stripe_already_collected_changes_nothing_there(
    world, stripe_api, tasks_in_process, django_capture_on_commit_callbacks
):
    invoice, stripe_id = pushed_invoice(world.tenant, stripe_api)
    stripe_api.pay_invoice(stripe_id)  # paid online; its webhook hasn't arrived yet
    with django_capture_on_commit_callbacks(execute=True):
        invoice_status_change(to=InvoiceStatus.VOID, invoice=invoice, user=world.owner)
    assert stripe_api.invoices[stripe_id]["status"] == "paid"


def test_an_invoice_voided_before_stripe_finalized_it_stays_a_stripe_draft(world, stripe_api):
    invoice = finalized_with(world.tenant, Decimal("42"))
    stripe_api.fail_next(1, path="/v1/invoices/in_")  # the finalize call
    with pytest.raises(StripeUnavailable):
        stripe_sync.invoice_push(invoice=invoice)
    invoice_status_change(to=InvoiceStatus.VOID, invoice=invoice, user=world.owner)
    pushed = stripe_sync.invoice_push(invoice=invoice)  # the retry
    assert pushed.sent_at is None
    (stripe_invoice,) = stripe_api.invoices.values()
    assert stripe_invoice["status"] == "draft"
