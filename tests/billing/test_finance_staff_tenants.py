"""Billing on the staff's organisation pages (through console.staff_extensions): the list
shows each tenant's month-to-date spend, balance due and credit; an organisation's page
shows them with its tax and payment terms, which staff edit through the billing service,
audited with their e-mail; the discount stays on the marketplace's commercials page."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.finance.selectors import month_start, tenant_money
from billing.invoices.services import invoice_finalize
from billing.metering import meter_tick
from billing.models import TenantBillingProfile, UsageRecord
from billing.profiles import billing_profile_update
from console.models import AuditEvent
from console.service_errors import ServiceError
from jobs.models import JobStatus
from tests.billing.conftest import give_credit, make_job, set_status
from tests.billing.test_finance_console import make_invoice, month, page_text
from tests.conftest import make_world, signed_in_client
from tests.factories import UserFactory


@pytest.fixture
def staff_user(db):
    return UserFactory(email="ops@gpugeek.test", is_staff=True)


@pytest.fixture
def money(world, other_world, catalog):
    """acme: a CPU job this month (metered), an open invoice and 12.50 credit; globex:
    nothing at all."""
    start = month_start(timezone.now()) + timedelta(minutes=1)
    job = make_job(world, name="mtd", cpus=2, start=start)
    set_status(job, JobStatus.RUNNING, start)
    set_status(job, JobStatus.SUCCEEDED, start + timedelta(minutes=40))
    meter_tick(now=start + timedelta(minutes=41))
    invoice = make_invoice(world.tenant, start=month(2026, 3), amount="42.42")
    give_credit(world.tenant, "12.50")
    spend = sum(UsageRecord.objects.filter(tenant=world.tenant).values_list("amount", flat=True))
    assert spend > 0
    return {"spend": spend, "invoice": invoice}


def row_of(html: str, slug: str) -> list[str]:
    """The cells of an organisation's row on the staff list, as text."""
    row = re.search(rf"<tr><td><a href=\"[^\"]*/{slug}/\">.*?</tr>", html, re.S)
    assert row, f"no row for {slug}"
    return [
        re.sub(r"<[^>]+>", "", cell).strip()
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)
    ]


def test_tenant_money_is_exact(world, other_world, money):
    figures = tenant_money(tenant_ids=[world.tenant.pk, other_world.tenant.pk], now=timezone.now())
    acme, globex = figures[world.tenant.pk], figures[other_world.tenant.pk]
    assert acme.mtd_spend == {"USD": money["spend"]}
    assert acme.balance_due == {"USD": money["invoice"].amount_due} == {"USD": Decimal("42.42")}
    assert acme.credit == Decimal("12.50")
    assert (globex.mtd_spend, globex.balance_due, globex.credit) == ({}, {}, 0)


def test_staff_list_shows_spend_balance_due_and_credit(world, other_world, money, staff_user):
    html = page_text(signed_in_client(staff_user).get(reverse("staff_tenants")))
    for header in ("Spend this month", "Balance due", "Credit"):
        assert f">{header}</th>" in html
    acme = row_of(html, "acme")
    spend = money["spend"].quantize(Decimal("0.01"))
    assert acme[3:6] == [f"{spend} USD", "42.42 USD", "12.50"]
    assert row_of(html, "globex")[3:6] == ["—", "—", "0.00"]


def test_staff_list_reads_money_in_a_fixed_number_of_queries(
    world, money, staff_user, django_assert_max_num_queries
):
    for prefix in ("initech", "umbrella", "hooli"):
        make_world(prefix)
    client = signed_in_client(staff_user)
    with django_assert_max_num_queries(10):
        page_text(client.get(reverse("staff_tenants")))


def test_staff_edit_tax_and_terms_audited_with_their_email(world, money, staff_user):
    client = signed_in_client(staff_user)
    detail = page_text(client.get(reverse("staff_tenant_detail", args=["acme"])))
    assert 'data-testid="staff-tenant-billing"' in detail
    assert reverse("billing:staff_tenant_billing", args=["acme"]) in detail
    assert reverse("marketplace:staff_tenant_commercials", args=["acme"]) in detail  # discount
    assert "42.42 USD" in detail and "12.50" in detail
    response = client.post(
        reverse("billing:staff_tenant_billing", args=["acme"]),
        {"tax_rate_percent": "19", "tax_label": "VAT", "payment_terms_days": "14"},
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("staff_tenant_detail", args=["acme"])
    profile = TenantBillingProfile.objects.get(tenant=world.tenant)
    assert (profile.tax_rate_percent, profile.tax_label, profile.payment_terms_days) == (
        Decimal("19"), "VAT", 14,
    )  # fmt: skip
    event = AuditEvent.objects.get(action="billing.profile_update")
    assert event.actor_label == "ops@gpugeek.test" and event.tenant == world.tenant
    assert event.metadata["before"] == {
        "tax_rate_percent": "0.000", "tax_label": "Tax", "payment_terms_days": 30,
    }  # fmt: skip
    assert event.metadata["after"]["tax_rate_percent"] == "19.000"
    # The next finalized invoice takes them.
    draft = make_invoice(world.tenant, start=month(2026, 4), amount="100", finalized_at=None)
    now = timezone.now()
    invoice = invoice_finalize(invoice=draft, user=None, now=now)
    assert invoice.tax == Decimal("19") and invoice.tax_label == "VAT"
    assert invoice.due_at == now + timedelta(days=14)


def test_bad_settings_are_refused_and_nothing_changes(world, money, staff_user):
    client = signed_in_client(staff_user)
    url = reverse("billing:staff_tenant_billing", args=["acme"])
    html = page_text(
        client.post(url, {"tax_rate_percent": "150", "tax_label": "", "payment_terms_days": "-1"})
    )
    assert "has-error" in html
    assert not AuditEvent.objects.filter(action="billing.profile_update").exists()
    assert TenantBillingProfile.objects.get(tenant=world.tenant).tax_rate_percent == 0
    with pytest.raises(ServiceError):
        billing_profile_update(
            tenant=world.tenant, tax_rate_percent=Decimal("1.2345"), tax_label="VAT",
            payment_terms_days=30, user=staff_user,
        )  # fmt: skip
    assert page_text(client.get(url)).count('name="tax_label"') == 1


def test_only_staff_reach_the_billing_settings(world, other_world, money):
    for user in (world.owner, world.finance):
        client = signed_in_client(user, world.tenant)
        url = reverse("billing:staff_tenant_billing", args=["acme"])
        assert client.get(url).status_code == 404
        response = client.post(
            url, {"tax_rate_percent": "1", "tax_label": "X", "payment_terms_days": "1"}
        )
        assert response.status_code == 404
    assert TenantBillingProfile.objects.get(tenant=world.tenant).tax_rate_percent == 0
    staff = signed_in_client(UserFactory(is_staff=True))
    assert staff.get(reverse("billing:staff_tenant_billing", args=["nope"])).status_code == 404
