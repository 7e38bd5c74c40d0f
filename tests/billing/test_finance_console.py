"""The finance console's invoice list: filters and totals (exact Decimals), CSV export
(formulas neutralised), ageing buckets at their boundaries, empty states, and who sees
what: a tenant's finance people their own organisation only (a foreign `?tenant=` is
ignored), other members 403, platform staff every tenant.

Invoices are made by the real services (draft, adjustment, finalize, pay, void); the
revenue dashboard is in test_finance_revenue.py, the staff tenants pages in
test_finance_staff_tenants.py.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import plotly.graph_objects as go
import pytest
from django.urls import reverse
from django.utils import timezone

from billing.finance import charts as finance_charts
from billing.finance.selectors import (
    AGEING_BUCKETS,
    InvoiceFilter,
    ageing_bucket,
    finance_invoices,
    finance_scope,
    invoice_ageing,
    invoice_totals,
)
from billing.invoices.services import (
    invoice_adjustment_add,
    invoice_draft_create,
    invoice_finalize,
    invoice_payment_failure_record,
    invoice_status_change,
)
from billing.models import Invoice, InvoiceStatus
from billing.profiles import billing_profile_update
from tests.conftest import signed_in_client
from tests.factories import TenantFactory, UserFactory

CENT = Decimal("0.01")
FINALIZED_AT = datetime(2026, 10, 3, 9, 30, tzinfo=UTC)


def month(year: int, number: int) -> datetime:
    return datetime(year, number, 1, tzinfo=UTC)


def next_month_of(start: datetime) -> datetime:
    return (start + timedelta(days=32)).replace(day=1)


def make_invoice(
    tenant, *, start: datetime, amount: str, finalized_at: datetime | None = FINALIZED_AT
) -> Invoice:
    """A one-month invoice of one adjustment line (no usage), finalized at
    `finalized_at` (None: left a draft)."""
    draft = invoice_draft_create(tenant=tenant, period_start=start, period_end=next_month_of(start))
    invoice_adjustment_add(
        invoice=draft, description="Support plan", amount=Decimal(amount), reason="contract",
        user=None,
    )  # fmt: skip
    if finalized_at is None:
        return Invoice.objects.get(pk=draft.pk)
    return invoice_finalize(invoice=draft, user=None, now=finalized_at)


@pytest.fixture
def staff_user(db):
    return UserFactory(email="ops@gpugeek.test", is_staff=True)


@pytest.fixture
def books(world, other_world, staff_user):
    """acme (7.5 % tax): open Sep (overdue), paid Oct, void Aug, uncollectible Jul, a
    Nov draft; globex: open Oct. Finalized on FINALIZED_AT, due 30 days later."""
    billing_profile_update(
        tenant=world.tenant, tax_rate_percent=Decimal("7.5"), tax_label="VAT",
        payment_terms_days=30, user=staff_user,
    )  # fmt: skip
    acme = {
        "open": make_invoice(world.tenant, start=month(2026, 9), amount="100.10"),
        "paid": make_invoice(world.tenant, start=month(2026, 10), amount="33.33"),
        "void": make_invoice(world.tenant, start=month(2026, 8), amount="50"),
        "uncollectible": make_invoice(world.tenant, start=month(2026, 7), amount="20.02"),
        "draft": make_invoice(
            world.tenant, start=month(2026, 11), amount="7.77", finalized_at=None
        ),
    }
    invoice_status_change(to=InvoiceStatus.PAID, invoice=acme["paid"], user=None)
    invoice_status_change(to=InvoiceStatus.VOID, invoice=acme["void"], user=None)
    invoice_status_change(to=InvoiceStatus.UNCOLLECTIBLE, invoice=acme["uncollectible"], user=None)
    globex = make_invoice(other_world.tenant, start=month(2026, 10), amount="999.99")
    return {key: Invoice.objects.get(pk=inv.pk) for key, inv in acme.items()} | {"globex": globex}


def page_text(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def by_testid(html: str, name: str) -> str:
    found = re.search(rf'data-testid="{re.escape(name)}">([^<]*)<', html)
    assert found, f"no {name} in the page"
    return found.group(1).strip()


def csv_rows(response) -> list[dict]:
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    return list(csv.DictReader(io.StringIO(response.content.decode())))


# --- selectors: filters and totals ---


def test_totals_over_the_filtered_set_are_exact(world, books):
    now = FINALIZED_AT + timedelta(days=45)  # 15 days past due
    scope = finance_scope(staff=False, own_tenant=world.tenant)
    invoices = finance_invoices(scope=scope, filters=InvoiceFilter(), now=now)
    assert {i.pk for i in invoices} == {books[k].pk for k in books if k != "globex"}
    (totals,) = invoice_totals(invoices, now=now)
    # 100.10 and 33.33 with 7.5 % VAT, each rounded to the cent once.
    assert books["open"].total == Decimal("107.61") and books["paid"].total == Decimal("35.83")
    assert books["uncollectible"].total == Decimal("21.52")
    assert totals.count == 5
    assert totals.invoiced == Decimal("107.61") + Decimal("35.83") + Decimal("21.52")
    assert totals.amount_due == totals.overdue == Decimal("107.61")
    assert totals.paid == Decimal("35.83")
    for value in (totals.invoiced, totals.amount_due, totals.paid):
        assert value == value.quantize(CENT) and isinstance(value, Decimal)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (InvoiceFilter(status="open"), {"open"}),
        (InvoiceFilter(status="void"), {"void"}),
        (InvoiceFilter(status="draft"), {"draft"}),
        (InvoiceFilter(period_from=month(2026, 9).date()), {"open", "paid", "draft"}),
        (InvoiceFilter(period_to=month(2026, 8).date()), {"void", "uncollectible"}),
        (
            InvoiceFilter(period_from=month(2026, 8).date(), period_to=month(2026, 9).date()),
            {"void", "open"},
        ),
        (InvoiceFilter(overdue=True), {"open"}),
        (InvoiceFilter(overdue=True, status="paid"), set()),
    ],
)
def test_filters(world, books, filters, expected):
    now = FINALIZED_AT + timedelta(days=31)
    scope = finance_scope(staff=False, own_tenant=world.tenant)
    found = set(
        finance_invoices(scope=scope, filters=filters, now=now).values_list("pk", flat=True)
    )
    assert found == {books[key].pk for key in expected}


def test_not_overdue_before_the_due_date(world, books):
    due_at = books["open"].due_at
    assert due_at == FINALIZED_AT + timedelta(days=30)
    scope = finance_scope(staff=False, own_tenant=world.tenant)
    overdue = InvoiceFilter(overdue=True)
    assert not finance_invoices(scope=scope, filters=overdue, now=due_at).exists()
    assert finance_invoices(scope=scope, filters=overdue, now=due_at + timedelta(seconds=1))


def test_scope_denies_by_default_and_ignores_a_foreign_tenant_for_tenants(
    world, other_world, books
):
    everything = InvoiceFilter()
    nobody = finance_scope(staff=False, own_tenant=None)
    assert not finance_invoices(scope=nobody, filters=everything, now=FINALIZED_AT).exists()
    asked_foreign = finance_scope(staff=False, own_tenant=world.tenant, tenant=other_world.tenant)
    pks = set(finance_invoices(scope=asked_foreign, filters=everything, now=FINALIZED_AT))
    assert books["globex"] not in pks and books["open"] in pks
    staff_all = finance_scope(staff=True, own_tenant=None)
    assert finance_invoices(scope=staff_all, filters=everything, now=FINALIZED_AT).count() == 6
    staff_one = finance_scope(staff=True, own_tenant=None, tenant=other_world.tenant)
    assert list(finance_invoices(scope=staff_one, filters=everything, now=FINALIZED_AT)) == [
        books["globex"]
    ]


# --- ageing ---


def test_ageing_bucket_boundaries():
    assert [ageing_bucket(days) for days in (0, 30, 31, 60, 61, 90, 91, 400)] == [
        0, 0, 1, 1, 2, 2, 3, 3,
    ]  # fmt: skip
    assert [label for label, _, _ in AGEING_BUCKETS] == [
        "0–30 days", "31–60 days", "61–90 days", "over 90 days",
    ]  # fmt: skip
    with pytest.raises(ValueError):
        ageing_bucket(-1)


def test_ageing_puts_each_day_count_in_its_bucket(world):
    """Open invoices exactly 30, 31, 60, 61, 90 and 91 days past due, one not yet due and
    one due this very moment (not overdue yet); amounts are powers of two so every
    bucket's sum says which invoices it holds. Payment terms: the default 30 days."""
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    past_due = {30: "1", 31: "2", 60: "4", 61: "8", 90: "16", 91: "32", -5: "64", 0: "128"}
    for index, (days, amount) in enumerate(past_due.items()):
        finalized = now - timedelta(days=days + 30)
        make_invoice(
            world.tenant, start=month(2025, 1 + index), amount=amount, finalized_at=finalized
        )
    scope = finance_scope(staff=False, own_tenant=world.tenant)
    ageing = invoice_ageing(scope=scope, now=now, currency="USD")
    assert [(b.amount, b.count) for b in ageing.buckets] == [
        (Decimal("1.00"), 1), (Decimal("6.00"), 2), (Decimal("24.00"), 2), (Decimal("32.00"), 1),
    ]  # fmt: skip
    assert ageing.not_yet_due == Decimal("192.00")  # due in 5 days, and due right now
    assert ageing.overdue == Decimal("63.00") and ageing.overdue_count == 6
    assert ageing.open_count == 8
    figure = finance_charts.ageing_bar(ageing)
    go.Figure(figure)  # valid Plotly JSON
    assert figure["data"][0]["y"] == [1.0, 6.0, 24.0, 32.0]
    assert figure["data"][0]["x"] == [label for label, _, _ in AGEING_BUCKETS]


def test_ageing_ignores_paid_void_and_uncollectible(world, books):
    scope = finance_scope(staff=False, own_tenant=world.tenant)
    ageing = invoice_ageing(scope=scope, now=FINALIZED_AT + timedelta(days=200), currency="USD")
    assert ageing.overdue == books["open"].amount_due and ageing.overdue_count == 1
    assert ageing.buckets[3].amount == books["open"].amount_due  # 170 days past due


# --- pages ---


def test_tenant_finance_sees_its_invoices_and_exact_totals(world, books):
    client = signed_in_client(world.finance, world.tenant)
    html = page_text(client.get(reverse("billing:finance_invoices")))
    for key in ("open", "paid", "void", "uncollectible"):
        assert books[key].number in html
    assert books["globex"].number not in html and "Globex" not in html
    assert by_testid(html, "total-invoiced-USD") == "164.96 USD"
    assert by_testid(html, "total-due-USD") == "107.61 USD"
    assert by_testid(html, "total-paid-USD") == "35.83 USD"
    assert reverse("billing:invoice_detail", args=[books["open"].pk]) in html
    assert "staff/invoices" not in html  # tenant users get the tenant's invoice pages


def test_a_foreign_tenant_filter_is_ignored_for_tenant_users(world, other_world, books):
    client = signed_in_client(world.owner, world.tenant)
    url = reverse("billing:finance_invoices")
    html = page_text(client.get(url, {"tenant": other_world.tenant.slug}))
    assert books["globex"].number not in html and books["open"].number in html
    rows = csv_rows(client.get(reverse("billing:finance_invoices_csv"), {"tenant": "globex"}))
    assert {row["organisation_slug"] for row in rows} == {"acme"}
    revenue = page_text(client.get(reverse("billing:finance_revenue"), {"tenant": "globex"}))
    assert "Globex" not in revenue


def test_filters_on_the_page_and_an_empty_result(world, books):
    client = signed_in_client(world.finance, world.tenant)
    url = reverse("billing:finance_invoices")
    html = page_text(client.get(url, {"status": "paid"}))
    assert books["paid"].number in html and books["open"].number not in html
    assert by_testid(html, "total-invoiced-USD") == "35.83 USD"
    html = page_text(client.get(url, {"period_from": "2026-10", "period_to": "2026-10"}))
    assert books["paid"].number in html and books["open"].number not in html
    html = page_text(client.get(url, {"period_from": "2027-01"}))
    assert "No invoice matches these filters" in html
    html = page_text(client.get(url, {"period_from": "2026-10", "period_to": "2026-09"}))
    assert "before the first" in html
    # htmx asks for the results only
    partial = page_text(client.get(url, {"status": "open"}, HTTP_HX_REQUEST="true"))
    assert partial.lstrip().startswith('<div id="results">') and "<html" not in partial


def test_empty_state_says_what_will_appear(world):
    client = signed_in_client(world.finance, world.tenant)
    html = page_text(client.get(reverse("billing:finance_invoices")))
    assert "No invoices yet" in html and "1st of the next month" in html
    assert 'data-testid="finance-invoice-table"' not in html


def test_csv_is_the_filtered_list_with_formulas_neutralised(world, books, staff_user):
    evil = TenantFactory(name='=HYPERLINK("http://evil.test","x")', slug="evil")
    bad = make_invoice(evil, start=month(2026, 10), amount="1")
    invoice_payment_failure_record(invoice=bad, message="+1+cmd|' /C calc'!A0", via="stripe")
    client = signed_in_client(staff_user)
    url = reverse("billing:finance_invoices_csv")
    rows = csv_rows(client.get(url, {"tenant": "evil"}))
    (row,) = rows
    assert row["organisation"] == "'" + evil.name
    assert row["payment_failure_message"] == "'+1+cmd|' /C calc'!A0"
    assert row["total"] == "1.00" and row["status"] == "open"
    # A tenant's own CSV: its filtered invoices, every figure as in the database.
    client = signed_in_client(world.finance, world.tenant)
    rows = csv_rows(client.get(url, {"status": "paid"}))
    (paid,) = rows
    invoice = books["paid"]
    assert paid["number"] == invoice.number and paid["organisation_slug"] == "acme"
    assert Decimal(paid["total"]) == invoice.total
    assert Decimal(paid["amount_due"]) == invoice.amount_due
    assert Decimal(paid["tax"]) == invoice.tax and paid["tax_label"] == "VAT"
    assert paid["period_start"] == invoice.period_start.isoformat()
    everything = csv_rows(client.get(url))
    assert [r["number"] for r in everything] == [
        i.number or "" for i in Invoice.objects.filter(tenant=world.tenant)
    ]
    assert client.get(url, {"period_from": "nonsense"}).status_code == 400


def test_overdue_days_show_in_list_and_csv(world, staff_user):
    finalized = timezone.now() - timedelta(days=40)  # due 10 days ago (30-day terms)
    invoice = make_invoice(world.tenant, start=month(2026, 1), amount="5", finalized_at=finalized)
    client = signed_in_client(world.finance, world.tenant)
    html = page_text(client.get(reverse("billing:finance_invoices"), {"overdue": "on"}))
    assert invoice.number in html and "overdue 10 d" in html
    (row,) = csv_rows(client.get(reverse("billing:finance_invoices_csv"), {"overdue": "on"}))
    assert row["days_past_due"] == "10"


def test_staff_see_every_tenant_and_filter_by_one(books, staff_user):
    client = signed_in_client(staff_user)
    url = reverse("billing:finance_invoices")
    html = page_text(client.get(url))
    assert books["globex"].number in html and books["open"].number in html
    assert reverse("billing:staff_invoice_detail", args=[books["globex"].pk]) in html
    html = page_text(client.get(url, {"tenant": "globex"}))
    assert books["globex"].number in html and books["open"].number not in html
    assert by_testid(html, "total-invoiced-USD") == f"{books['globex'].total} USD"
    assert "Select a valid choice" in page_text(client.get(url, {"tenant": "no-such-tenant"}))


def test_members_without_the_billing_capability_are_refused(world, books):
    for user in (world.member, world.viewer):
        client = signed_in_client(user, world.tenant)
        for name in ("finance_invoices", "finance_invoices_csv", "finance_revenue"):
            response = client.get(reverse(f"billing:{name}"))
            assert response.status_code == 403, (user.email, name)
            assert books["open"].number not in response.content.decode()
    anonymous = signed_in_client(world.finance, world.tenant)
    anonymous.logout()
    response = anonymous.get(reverse("billing:finance_invoices"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_navigation_links_finance_for_billing_roles_only(world, staff_user):
    link = f'href="{reverse("billing:finance_invoices")}"'
    for user, shown in ((world.finance, True), (world.owner, True), (world.member, False)):
        html = page_text(signed_in_client(user, world.tenant).get(reverse("dashboard")))
        assert (link in html) is shown, user.email
    html = page_text(signed_in_client(staff_user).get(reverse("staff_tenants")))
    assert link in html


def test_list_query_count_does_not_grow_with_rows(
    books, staff_user, other_world, django_assert_max_num_queries
):
    for number in range(1, 9):
        make_invoice(other_world.tenant, start=month(2025, number), amount=str(number))
    client = signed_in_client(staff_user)
    with django_assert_max_num_queries(12):
        page_text(client.get(reverse("billing:finance_invoices")))


def test_statuses_offered_are_the_invoice_statuses(world):
    html = page_text(signed_in_client(world.finance, world.tenant).get(
        reverse("billing:finance_invoices")
    ))  # fmt: skip
    for value, _label in InvoiceStatus.choices:
        assert f'value="{value}"' in html
    assert 'id="id_tenant"' not in html  # no organisation filter for tenant users
