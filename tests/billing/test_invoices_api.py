"""/api/v1/invoices: who reads what, the staff lifecycle, and every bad input as JSON."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from billing.invoices.services import invoice_adjustment_add, invoice_draft_create, invoice_finalize
from billing.models import Invoice
from billing.payments import stripe_sync
from billing.payments.client import StripeUnavailable
from console.services.tokens import api_token_create
from tests.billing.stripe_helpers import fake_stripe_configured
from tests.billing.test_invoices import DEC, NOV, T0, run_job
from tests.conftest import make_world, token_client
from tests.factories import MembershipFactory, UserFactory

URL = "/api/v1/invoices"


@pytest.fixture(params=["member-token", "staff-token"])
def staff(request, world):
    """Platform staff's API client: with a token of an organisation staff belong to, and
    with a staff automation token (no organisation)."""
    user = UserFactory(email="staff@gpugeek.test", is_staff=True)
    if request.param == "staff-token":
        _, raw = api_token_create(user=user, tenant=None, name="automation")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        return client
    MembershipFactory(tenant=world.tenant, user=user, role="member")
    return token_client(user, world.tenant)


def open_invoice(world, amount=Decimal("100"), period=(NOV, DEC)):
    draft = invoice_draft_create(tenant=world.tenant, period_start=period[0], period_end=period[1])
    invoice_adjustment_add(invoice=draft, description="Fee", amount=amount, reason="r", user=None)
    return invoice_finalize(invoice=draft, user=None)


def test_staff_drafts_finalizes_and_reads_money_as_strings(world, catalog, staff):
    run_job(world, start=T0, seconds=5400, cpus=2)
    response = staff.post(
        URL,
        {"tenant": "acme", "period_start": "2026-11-01", "period_end": "2026-12-01"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "draft" and body["number"] is None and body["tenant"] == "acme"
    (line,) = body["lines"]
    assert set(line) >= {
        "description",
        "gpu_type",
        "tier",
        "region",
        "quantity",
        "unit",
        "unit_price",
        "amount",
    }
    assert isinstance(body["total"], str) and isinstance(line["amount"], str)
    response = staff.post(f"{URL}/{body['id']}/finalize")
    assert response.status_code == 200
    assert response.json()["status"] == "open"
    assert response.json()["number"] == f"GG-{datetime.now(UTC).year}-000001"
    assert staff.post(f"{URL}/{body['id']}/finalize").status_code == 409


def test_bad_input_is_json(world, catalog, staff):
    bad_period = {"tenant": "acme", "period_start": "2026-12-01", "period_end": "2026-11-01"}
    response = staff.post(URL, bad_period, format="json")
    assert response.status_code == 400 and "detail" in response.json()
    good = {"tenant": "acme", "period_start": "2026-11-01", "period_end": "2026-12-01"}
    draft_id = staff.post(URL, good, format="json").json()["id"]
    overlap = {"tenant": "acme", "period_start": "2026-11-15", "period_end": "2026-12-15"}
    response = staff.post(URL, overlap, format="json")
    assert response.status_code == 409 and response.json()["code"] == "conflict"
    response = staff.post(f"{URL}/{draft_id}/finalize")  # empty draft
    assert response.status_code == 400 and "detail" in response.json()
    assert staff.post(f"{URL}/{draft_id}/void").status_code == 409


def test_void_and_credit_note_rules(world, catalog, staff):
    invoice = open_invoice(world)
    url = f"{URL}/{invoice.pk}"
    response = staff.post(f"{url}/credit_notes", {"amount": "10.00"}, format="json")
    assert response.status_code == 400 and response.json()["reason"]
    response = staff.post(f"{url}/credit_notes", {"reason": "x", "amount": "100.01"}, format="json")
    assert response.status_code == 400
    response = staff.post(
        f"{url}/credit_notes",
        {"reason": "outage", "lines": [{"description": "GPU down", "amount": "25.00"}]},
        format="json",
    )
    assert response.status_code == 201
    assert response.json()["amount_due"] == "75.00"
    assert response.json()["credit_notes"][0]["number"].startswith("GGCN-")
    assert staff.post(f"{url}/mark_uncollectible").json()["status"] == "uncollectible"
    assert staff.post(f"{url}/void").status_code == 409
    Invoice.objects.filter(pk=invoice.pk).update(status="paid")
    assert staff.post(f"{url}/void").status_code == 409


def test_finance_reads_own_invoices_members_and_other_tenants_do_not(world, catalog):
    invoice = open_invoice(world)
    finance = token_client(world.finance, world.tenant)
    response = finance.get(URL)
    assert response.status_code == 200 and [i["id"] for i in response.json()["results"]] == [
        invoice.pk
    ]
    assert finance.get(f"{URL}/{invoice.pk}").json()["lines"][0]["amount"] == "100.000000000"
    assert finance.post(f"{URL}/{invoice.pk}/void").status_code == 404
    assert finance.post(URL, {}, format="json").status_code == 403
    assert token_client(world.member, world.tenant).get(URL).status_code == 403
    other = make_world("other")
    outsider = token_client(other.owner, other.tenant)
    assert outsider.get(f"{URL}/{invoice.pk}").status_code == 404
    assert outsider.get(URL).json()["results"] == []


def test_staff_sees_every_tenant_and_filters(world, catalog, staff):
    open_invoice(world)
    other = make_world("other")
    invoice_draft_create(tenant=other.tenant, period_start=NOV, period_end=DEC)
    assert staff.get(URL).json()["count"] == 2
    (only,) = staff.get(URL, {"tenant": "other"}).json()["results"]
    assert only["tenant"] == "other"


def test_list_query_count_is_flat(world, catalog, staff, django_assert_max_num_queries):
    for month in range(1, 8):
        start = datetime(2026, month, 1, tzinfo=UTC)
        invoice_draft_create(
            tenant=world.tenant, period_start=start, period_end=start.replace(month=month + 1)
        )
    with django_assert_max_num_queries(12):
        assert staff.get(URL).json()["count"] == 7


def stripe_fields(client, invoice) -> dict:
    return client.get(f"{URL}/{invoice.pk}").json()["stripe"]


@pytest.fixture
def stripe_api(settings):
    yield from fake_stripe_configured(settings)


def test_detail_says_whether_and_where_the_invoice_is_at_stripe(world, stripe_api, settings):
    finance = token_client(world.finance, world.tenant)
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    assert stripe_fields(finance, draft) == {
        "sync_status": "not_applicable",  # a draft: nothing to collect
        "stripe_invoice_id": "",
        "hosted_invoice_url": "",
    }
    invoice = open_invoice(world, Decimal("80"), period=(DEC, DEC.replace(month=1, year=2027)))
    assert stripe_fields(finance, invoice)["sync_status"] == "pending"
    stripe_api.fail_next(1)
    with pytest.raises(StripeUnavailable):
        stripe_sync.invoice_push(invoice=invoice)
    assert stripe_fields(finance, invoice)["sync_status"] == "pending"  # retried later
    stripe_sync.invoice_push(invoice=invoice)
    (at_stripe,) = stripe_api.invoices.values()
    assert stripe_fields(finance, invoice) == {
        "sync_status": "sent",
        "stripe_invoice_id": at_stripe["id"],
        "hosted_invoice_url": at_stripe["hosted_invoice_url"],
    }
    assert "stripe" not in finance.get(URL).json()["results"][0]  # detail only
    settings.STRIPE_API_KEY = ""
    assert stripe_fields(finance, draft)["sync_status"] == "not_configured"


def test_credit_lines_tied_to_invoice_lines_credit_at_most_what_is_left(world, catalog, staff):
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    for amount in ("30", "70"):
        invoice_adjustment_add(
            invoice=draft,
            description=f"Fee {amount}",
            amount=Decimal(amount),
            reason="r",
            user=None,
        )
    invoice = invoice_finalize(invoice=draft, user=None)
    small, big = invoice.lines.order_by("amount")
    url = f"{URL}/{invoice.pk}/credit_notes"

    def credit_lines(*lines):
        return staff.post(url, {"reason": "outage", "lines": list(lines)}, format="json")

    response = credit_lines({"amount": "20.00", "invoice_line": small.pk})
    assert response.status_code == 201, response.json()
    (note,) = response.json()["credit_notes"]
    assert note["lines"][0]["invoice_line"] == small.pk
    # 10 left on the small line: two lines of one note count together.
    response = credit_lines(
        {"amount": "6.00", "invoice_line": small.pk}, {"amount": "6.00", "invoice_line": small.pk}
    )
    assert response.status_code == 400 and "Only 10.00 USD" in response.json()["detail"]
    other = open_invoice(make_world("other"))
    response = credit_lines({"amount": "1.00", "invoice_line": other.lines.get().pk})
    assert response.status_code == 400 and "has no line" in response.json()["detail"]
    response = credit_lines(
        {"amount": "10.00", "invoice_line": small.pk}, {"amount": "70.00", "invoice_line": big.pk}
    )
    assert response.status_code == 201
    assert staff.get(f"{URL}/{invoice.pk}").json()["amount_credited"] == "100.00"
