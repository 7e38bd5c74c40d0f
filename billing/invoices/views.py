"""Invoice pages: a tenant's invoices (owner, admin, finance), and the staff lifecycle
actions on every tenant's. Thin: parse, call invoicing / credit_notes, render."""

from __future__ import annotations

from functools import partial

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from billing.credit_notes import services as credit_notes
from billing.invoices import services as invoicing
from billing.invoices.forms import AdjustmentForm, CreditNoteForm, DraftForm
from billing.invoices.pdf import invoice_pdf
from billing.invoices.selectors import invoices_visible, ledger_invoice_mismatches
from billing.models import Invoice, InvoiceStatus
from billing.payments.selectors import invoice_stripe_state
from billing.selectors import utc_midnight
from console.confirm import confirm_then_act
from console.csv import csv_writer
from console.forms import add_service_error
from console.permissions import Capability, capability_required, staff_required
from console.service_errors import ServiceError
from console.tenancy import get_for_tenant_or_404


def _detail_context(invoice: Invoice, *, staff: bool) -> dict:
    return {
        "invoice": invoice,
        "stripe": invoice_stripe_state(invoice=invoice),
        "lines": list(invoice.lines.all()),
        "credit_notes": list(invoice.credit_notes.prefetch_related("lines")),
        "staff": staff,
        "adjustment_form": AdjustmentForm(),
        "credit_note_form": CreditNoteForm(),
    }


@capability_required(Capability.VIEW_INVOICES)
def invoices(request: HttpRequest) -> HttpResponse:
    rows = invoices_visible(tenant=request.tenant, staff=False)  # type: ignore[attr-defined]
    return render(request, "billing/invoices/list.html", {"invoices": rows, "staff": False})


@capability_required(Capability.VIEW_INVOICES)
def invoice_detail(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = get_for_tenant_or_404(Invoice, request.tenant, pk=invoice_id)  # type: ignore[attr-defined]
    template = (
        "billing/invoices/print.html"
        if request.GET.get("print")
        else "billing/invoices/detail.html"
    )
    return render(request, template, _detail_context(invoice, staff=False))


@capability_required(Capability.VIEW_INVOICES)
def invoice_lines_csv(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = get_for_tenant_or_404(Invoice, request.tenant, pk=invoice_id)  # type: ignore[attr-defined]
    response = HttpResponse(content_type="text/csv")
    name = invoice.number or f"draft-{invoice.pk}"
    response["Content-Disposition"] = f'attachment; filename="{name}.csv"'
    writer = csv_writer(response)
    writer.writerow(
        [
            "kind",
            "description",
            "gpu_type",
            "tier",
            "region",
            "quantity",
            "unit",
            "unit_price",
            "amount",
            "currency",
        ]
    )
    for line in invoice.lines.all():
        writer.writerow(
            [line.kind, line.description, line.gpu_type, line.tier, line.region, line.quantity,
             line.unit, line.unit_price, line.amount, invoice.currency]
        )  # fmt: skip
    return response


@capability_required(Capability.VIEW_INVOICES)
def invoice_pdf_download(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = get_for_tenant_or_404(Invoice, request.tenant, pk=invoice_id)  # type: ignore[attr-defined]
    response = HttpResponse(invoice_pdf(invoice=invoice), content_type="application/pdf")
    name = invoice.number or f"draft-{invoice.pk}"
    response["Content-Disposition"] = f'attachment; filename="{name}.pdf"'
    return response


# --- platform staff ---


@staff_required
@require_http_methods(["GET", "POST"])
def staff_invoices(request: HttpRequest) -> HttpResponse:
    form = DraftForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            invoice = invoicing.invoice_draft_create(
                tenant=data["tenant"],
                period_start=utc_midnight(data["period_start"]),
                period_end=utc_midnight(data["period_end"]),
                user=request.user,  # type: ignore[arg-type]
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            messages.success(request, "Draft invoice created.")
            return redirect("billing:staff_invoice_detail", invoice_id=invoice.pk)
    rows = invoices_visible(tenant=None, staff=True, tenant_slug=request.GET.get("tenant", ""))
    return render(
        request, "billing/invoices/list.html", {"invoices": rows, "staff": True, "form": form}
    )


@staff_required
def staff_invoice_detail(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = get_object_or_404(Invoice, pk=invoice_id)
    return render(request, "billing/invoices/detail.html", _detail_context(invoice, staff=True))


@staff_required
def staff_invoice_mismatches(request: HttpRequest) -> HttpResponse:
    return render(
        request, "billing/invoices/mismatches.html", {"mismatches": ledger_invoice_mismatches()}
    )


ACTIONS = {
    # action: (service, title, button, done)
    "finalize": (
        invoicing.invoice_finalize, "Finalize", "Finalize and number it", "Invoice finalized.",
    ),
    "void": (
        partial(invoicing.invoice_status_change, to=InvoiceStatus.VOID),
        "Void", "Void invoice", "Invoice voided.",
    ),
    "mark_uncollectible": (
        partial(invoicing.invoice_status_change, to=InvoiceStatus.UNCOLLECTIBLE),
        "Mark uncollectible", "Mark uncollectible", "Invoice marked uncollectible.",
    ),
    "delete": (invoicing.invoice_draft_delete, "Delete draft", "Delete draft", "Draft deleted."),
}  # fmt: skip


@staff_required
@require_http_methods(["GET", "POST"])
def staff_invoice_action(request: HttpRequest, invoice_id: int, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404("Not found.")
    invoice = get_object_or_404(Invoice, pk=invoice_id)
    service, title, label, done = ACTIONS[action]
    detail_url = reverse("billing:staff_invoice_detail", args=[invoice.pk])
    return confirm_then_act(
        request,
        title=f"{title} {invoice} of {invoice.tenant}?",
        message="This is recorded in the audit log and can't be undone.",
        confirm_label=label,
        act=lambda: service(invoice=invoice, user=request.user),
        success_url=reverse("billing:staff_invoices") if action == "delete" else detail_url,
        success_message=done,
        cancel_url=detail_url,
    )


@staff_required
@require_POST
def staff_invoice_adjustment(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = get_object_or_404(Invoice, pk=invoice_id)
    form = AdjustmentForm(request.POST)
    if not form.is_valid():
        messages.error(request, "An adjustment needs a description, an amount and a reason.")
    else:
        try:
            invoicing.invoice_adjustment_add(
                invoice=invoice, user=request.user, **form.cleaned_data
            )  # type: ignore[arg-type]
            messages.success(request, "Adjustment added.")
        except ServiceError as error:
            messages.error(request, error.message)
    return redirect("billing:staff_invoice_detail", invoice_id=invoice.pk)


@staff_required
@require_POST
def staff_invoice_credit_note(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = get_object_or_404(Invoice, pk=invoice_id)
    form = CreditNoteForm(request.POST)
    if not form.is_valid():
        messages.error(request, "A credit note needs an amount and a reason.")
    else:
        try:
            note = credit_notes.credit_note_create(
                invoice=invoice, user=request.user, **form.cleaned_data
            )  # type: ignore[arg-type]
            messages.success(request, f"Credit note {note.number} issued.")
        except ServiceError as error:
            messages.error(request, error.message)
    return redirect("billing:staff_invoice_detail", invoice_id=invoice.pk)
