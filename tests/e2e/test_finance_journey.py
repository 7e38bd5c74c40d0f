"""Finance's journey (issue 14): sign in, open last month's invoice (built from metered
usage and finalized), download the CSV of its lines, and see it paid once a signed
Stripe webhook arrives at the real server."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from billing.invoices.services import invoice_draft_create, invoice_finalize
from billing.metering import meter_tick
from billing.models import Invoice
from console.models import AuditEvent
from jobs.backends.local import LocalBackend
from jobs.models import JobStatus
from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync
from tests.billing.conftest import make_job, set_status
from tests.e2e.test_launch_job import sign_in
from tests.fakes.stripe_api import sign

pytestmark = pytest.mark.e2e

WEBHOOK_SECRET = "whsec_e2e_finance_journey"


@pytest.fixture
def stripe_webhooks_on(monkeypatch):
    """The server (started after this fixture) verifies webhooks with this secret."""
    monkeypatch.setenv("STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET)


def last_months_invoice(world) -> Invoice:
    """Six hours of a 1-vCPU job in the middle of last month, metered, then invoiced."""
    this_month = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last_month = (this_month - timedelta(days=1)).replace(day=1)
    start = datetime(last_month.year, last_month.month, 10, 8, tzinfo=UTC)
    job = make_job(world, name="nightly-etl", start=start)
    set_status(job, JobStatus.RUNNING, start)
    meter_tick(now=start + timedelta(hours=3))
    set_status(job, JobStatus.SUCCEEDED, start + timedelta(hours=6))
    meter_tick(now=start + timedelta(hours=7))
    draft = invoice_draft_create(
        tenant=world.tenant, period_start=last_month, period_end=this_month
    )
    return invoice_finalize(invoice=draft, user=None, now=this_month + timedelta(hours=1))


def test_finance_reviews_exports_and_sees_a_paid_invoice(
    stripe_webhooks_on, browser_page, asgi_server, world, password, tmp_path
):
    page, base = browser_page, asgi_server.url
    seed_catalog()
    capacity_sync(backend=LocalBackend())
    invoice = last_months_invoice(world)
    assert invoice.status == "open" and invoice.total > 0

    sign_in(page, base, world.finance.email, password)
    page.goto("/billing/invoices/")
    page.get_by_role("link", name=invoice.number).click()
    heading = page.get_by_role("heading", level=1)
    expect(heading).to_contain_text(invoice.number)
    expect(heading).to_contain_text("Open")

    with page.expect_download() as download:
        page.get_by_role("link", name="CSV of the lines").click()
    saved = tmp_path / "lines.csv"
    download.value.save_as(saved)
    text = saved.read_text()
    assert "description" in text.splitlines()[0].lower()
    assert str(invoice.total) in text or any(
        str(line.amount) in text for line in invoice.lines.all()
    ), text

    paid = {
        "id": "evt_e2e_paid",
        "object": "event",
        "type": "invoice.paid",
        "data": {
            "object": {
                "id": "in_e2e_1",
                "object": "invoice",
                "status": "paid",
                "metadata": {
                    "gpugeek_invoice": str(invoice.pk),
                    "gpugeek_number": invoice.number,
                    "gpugeek_installation": settings.GPUGEEK_INSTALLATION_ID,
                },
            }
        },
    }
    payload = json.dumps(paid)
    for _ in range(2):  # delivered twice, as Stripe may: applied once
        answer = httpx.post(
            f"{base}/billing/stripe/webhook/",
            content=payload,
            headers={
                "Content-Type": "application/json",
                "Stripe-Signature": sign(payload, WEBHOOK_SECRET, int(time.time())),
            },
        )
        assert answer.status_code == 200, answer.text
    forged = httpx.post(
        f"{base}/billing/stripe/webhook/",
        content=payload.replace("evt_e2e_paid", "evt_forged"),
        headers={"Stripe-Signature": sign(payload, "whsec_wrong", int(time.time()))},
    )
    assert forged.status_code == 400

    page.reload()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Paid")
    invoice.refresh_from_db()
    assert invoice.status == "paid"
    assert AuditEvent.objects.filter(action="invoice.paid", target_id=str(invoice.pk)).count() == 1
