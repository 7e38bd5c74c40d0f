"""/api/v1/invoices: who reads what, the staff lifecycle, and every bad input as JSON."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing.invoicing import invoice_adjustment_add, invoice_draft_create, invoice_finalize
from billing.models import Invoice
from tests.billing.test_invoices import DEC, NOV, T0, run_job
from tests.conftest import make_world, token_client
from tests.factories import MembershipFactory, UserFactory

URL = "/api/v1/invoices"


@pytest.fixture
def staff(world):
    """Platform staff, also a member of `world` so it can hold an API token."""
    user = UserFactory(email="staff@gpugeek.test", is_staff=True)
    MembershipFactory(tenant=world.tenant, user=user, role="member")
    return token_client(user, world.tenant)


def open_invoice(world, amount=Decimal("100")):
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
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
