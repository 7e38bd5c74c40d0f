"""The invoice PDF download: a valid PDF whose page shows what the printable view shows,
for the roles that see invoices, and a 404 for another tenant's invoice."""

from __future__ import annotations

import re
import zlib
from decimal import Decimal

import pytest
from django.urls import reverse

from billing.credit_notes.services import credit_note_create
from billing.invoices.services import invoice_adjustment_add, invoice_finalize
from billing.models import Invoice
from tests.billing.stripe_helpers import draft_with
from tests.conftest import signed_in_client

pytestmark = pytest.mark.django_db


def page_text(pdf: bytes) -> str:
    """The text drawn on the pages: every string shown by a Tj operator, from the
    (zlib-compressed) content streams."""
    shown = []
    for stream in re.findall(rb"stream\r?\n(.*?)\r?\nendstream", pdf, re.DOTALL):
        try:
            content = zlib.decompress(stream)
        except zlib.error:
            continue  # not a content stream (a font, an image)
        shown += re.findall(rb"\((.*?)(?<!\\)\)\s*Tj", content, re.DOTALL)
    text = b" ".join(shown).decode("latin-1")
    return re.sub(r"\\(.)", r"\1", text)  # PDF string escapes: \( \) \\


def pdf_of(client, invoice: Invoice):
    return client.get(reverse("billing:invoice_pdf", args=[invoice.pk]))


@pytest.fixture
def invoice(world) -> Invoice:
    draft = draft_with(world.tenant, Decimal("120"))
    invoice_adjustment_add(
        invoice=draft,
        description="GPU – H100 × 2 in 東京",
        amount=Decimal("30.50"),
        reason="goodwill “thanks”",
        user=None,
    )
    invoice = invoice_finalize(invoice=draft, user=None)
    credit_note_create(invoice=invoice, reason="outage", amount=Decimal("10.00"), user=None)
    invoice.refresh_from_db()
    return invoice


def test_the_pdf_shows_number_lines_totals_and_credit_notes(world, invoice):
    response = pdf_of(signed_in_client(world.finance, world.tenant), invoice)

    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    assert response["Content-Disposition"] == f'attachment; filename="{invoice.number}.pdf"'
    body = response.content
    assert body.startswith(b"%PDF-") and body.rstrip().endswith(b"%%EOF")
    text = page_text(body)
    assert f"Invoice {invoice.number}" in text
    assert world.tenant.name in text and "Period 2026-11-01 - 2026-12-01" in text
    # Outside Latin-1: punctuation becomes its look-alike, other characters "?".
    assert "GPU - H100 \xd7 2 in ??" in text and 'goodwill "thanks"' in text
    # Money as every page shows it: two decimals, thousands grouped, the currency.
    assert f"{invoice.total:,.2f} {invoice.currency}" in text
    assert invoice.amount_due == Decimal("140.50") and "140.50 USD" in text
    assert "Credit notes" in text and "10.00 USD" in text
    (note,) = invoice.credit_notes.all()
    assert note.number in text and "outage" in text


def test_a_draft_downloads_too(world):
    draft = draft_with(world.tenant)
    response = pdf_of(signed_in_client(world.owner, world.tenant), draft)
    assert response["Content-Disposition"] == f'attachment; filename="draft-{draft.pk}.pdf"'
    text = page_text(response.content)
    assert "Invoice (draft)" in text and "No usage in this period." in text


def test_only_roles_with_invoices_and_only_their_own(world, other_world, invoice):
    assert pdf_of(signed_in_client(world.member, world.tenant), invoice).status_code == 403
    assert (
        pdf_of(signed_in_client(other_world.owner, other_world.tenant), invoice).status_code == 404
    )
    page = signed_in_client(world.admin, world.tenant).get(
        reverse("billing:invoice_detail", args=[invoice.pk])
    )
    assert reverse("billing:invoice_pdf", args=[invoice.pk]) in page.content.decode()
