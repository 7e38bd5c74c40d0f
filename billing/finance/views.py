"""The finance console: invoices across tenants with filters, totals and CSV export, and
the revenue dashboard; plus the staff's billing settings of a tenant. Thin: parse the
filters, build the scope, call finance_selectors / profiles, render.

Who sees what: platform staff every tenant (or the one they filter to); a tenant's
owner, admins and finance people (VIEW_INVOICES) their own organisation only; other
members are refused (403) like on the invoice pages.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import wraps

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from billing.finance import charts as finance_charts
from billing.finance import revenue as revenue_selectors
from billing.finance import selectors as finance_selectors
from billing.finance.forms import BillingProfileForm, InvoiceFilterForm, RevenueFilterForm
from billing.finance.selectors import FinanceScope, InvoiceFilter, finance_scope
from billing.profiles import billing_profile_update
from billing.staff_tenants import billing_panel_context
from console.csv import csv_writer
from console.forms import add_service_error
from console.models import Tenant
from console.permissions import Capability, capability_required, staff_required
from console.service_errors import ServiceError
from marketplace.selectors import gpu_type_colours

PAGE_SIZE = 50
DEFAULT_MONTHS = 12


def finance_access(view: Callable) -> Callable:
    """Platform staff, or a tenant member with VIEW_INVOICES (anyone else: 403)."""
    tenant_view = capability_required(Capability.VIEW_INVOICES)(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.user.is_authenticated and request.user.is_staff:
            return view(request, *args, **kwargs)
        return tenant_view(request, *args, **kwargs)

    return wrapper


def _scope(request: HttpRequest, data: dict) -> FinanceScope:
    return finance_scope(
        staff=request.user.is_staff,
        own_tenant=getattr(request, "tenant", None),
        tenant=data.get("tenant"),
    )


def _query_without_page(request: HttpRequest) -> str:
    query = request.GET.copy()
    query.pop("page", None)
    return query.urlencode()


def _invoice_query(
    request: HttpRequest,
) -> tuple[InvoiceFilterForm, FinanceScope | None, InvoiceFilter]:
    form = InvoiceFilterForm(request.GET or None, staff=request.user.is_staff)
    if form.is_bound and not form.is_valid():
        return form, None, InvoiceFilter()
    data = form.cleaned_data if form.is_bound else {}
    filters = InvoiceFilter(
        status=data.get("status") or "",
        period_from=data.get("period_from"),
        period_to=data.get("period_to"),
        overdue=bool(data.get("overdue")),
    )
    return form, _scope(request, data), filters


@finance_access
def finance_invoices(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    form, scope, filters = _invoice_query(request)
    context: dict = {"form": form, "staff": request.user.is_staff, "scope": scope}
    if scope is not None:
        invoices = finance_selectors.finance_invoices(scope=scope, filters=filters, now=now)
        page = Paginator(invoices, PAGE_SIZE).get_page(request.GET.get("page"))
        context.update(
            {
                "page": page,
                "rows": [
                    (invoice, finance_selectors.days_past_due(invoice, now=now)) for invoice in page
                ],
                "totals": finance_selectors.invoice_totals(invoices, now=now),
                "query": _query_without_page(request),
                "filtered": form.is_bound,
            }
        )
    template = (
        "billing/finance/invoices.html#results" if request.htmx else "billing/finance/invoices.html"
    )
    return render(request, template, context)


CSV_HEADER = [
    "number", "organisation", "organisation_slug", "status", "period_start", "period_end",
    "currency", "subtotal", "discount", "tax_label", "tax", "total", "credits_applied",
    "amount_credited", "amount_due", "due_at", "days_past_due", "finalized_at", "paid_at",
    "payment_failed_at", "payment_failure_message",
]  # fmt: skip


def _iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment else ""


@finance_access
def finance_invoices_csv(request: HttpRequest) -> HttpResponse:
    """The filtered list, every page. Names and messages go through the formula-
    neutralising writer; amounts go in as Decimals (a credit stays a number)."""
    now = timezone.now()
    form, scope, filters = _invoice_query(request)
    if scope is None:
        errors = "; ".join(e for errs in form.errors.values() for e in errs)
        return HttpResponse(f"Bad filters: {errors}", status=400, content_type="text/plain")
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="invoices-{now:%Y%m%d}.csv"'
    writer = csv_writer(response)
    writer.writerow(CSV_HEADER)
    invoices = finance_selectors.finance_invoices(scope=scope, filters=filters, now=now)
    for invoice in invoices.iterator(chunk_size=500):
        overdue_days = finance_selectors.days_past_due(invoice, now=now)
        writer.writerow(
            [
                invoice.number or "", invoice.tenant.name, invoice.tenant.slug, invoice.status,
                _iso(invoice.period_start), _iso(invoice.period_end), invoice.currency,
                invoice.subtotal, invoice.discount, invoice.tax_label, invoice.tax,
                invoice.total, invoice.credits_applied, invoice.amount_credited,
                invoice.amount_due, _iso(invoice.due_at),
                "" if overdue_days is None else overdue_days, _iso(invoice.finalized_at),
                _iso(invoice.paid_at), _iso(invoice.payment_failed_at),
                invoice.payment_failure_message,
            ]
        )  # fmt: skip
    return response


def _revenue_period(data: dict, now: datetime) -> tuple[datetime, datetime]:
    """[first month, last month + 1): by default the last DEFAULT_MONTHS months, this one
    included."""
    this_month = finance_selectors.month_start(now)
    end = finance_selectors.next_month(
        finance_selectors.month_start(data["period_to"]) if data.get("period_to") else this_month
    )
    if data.get("period_from"):
        return finance_selectors.month_start(data["period_from"]), end
    start = end
    for _ in range(DEFAULT_MONTHS):
        start = finance_selectors.month_start(start.replace(day=1) - finance_selectors.ONE_DAY)
    return start, end


@finance_access
def finance_revenue(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    form = RevenueFilterForm(request.GET or None, staff=request.user.is_staff)
    context: dict = {"form": form, "staff": request.user.is_staff}
    if not form.is_bound or form.is_valid():
        data = form.cleaned_data if form.is_bound else {}
        scope = _scope(request, data)
        start, end = _revenue_period(data, now)
        dashboard = revenue_selectors.revenue_dashboard(
            scope=scope, start=start, end=end, now=now, currency=data.get("currency") or ""
        )
        figures = {"ageing": finance_charts.ageing_bar(dashboard.ageing)}
        # Series here are labelled with GPU types' names: their colours by name.
        colours = gpu_type_colours(by_name=True)
        if dashboard.total:
            figures.update(
                by_gpu_type=finance_charts.monthly_stacked(
                    dashboard.months, dashboard.by_gpu_type, dashboard.currency, colours
                ),
                by_tier=finance_charts.monthly_stacked(
                    dashboard.months, dashboard.by_tier, dashboard.currency
                ),
                tiers=finance_charts.tier_split(dashboard.tier_totals),
            )
        if dashboard.gpu_hours:
            figures["gpu_hours"] = finance_charts.monthly_stacked(
                dashboard.months, dashboard.gpu_hours, "GPU-hours", colours
            )
        if any(row.percent is not None for row in dashboard.utilisation):
            figures["utilisation"] = finance_charts.utilisation_bar(dashboard.utilisation)
        if dashboard.top_tenants:
            figures["top_tenants"] = finance_charts.top_tenants_bar(
                dashboard.top_tenants, dashboard.currency
            )
        context.update(
            {
                "scope": scope,
                "dashboard": dashboard,
                "figures": figures,
                "now": now,
                "last_day": end - finance_selectors.ONE_DAY,
                "query": _query_without_page(request),
            }
        )
    return render(request, "billing/finance/revenue.html", context)


# --- platform staff: a tenant's billing settings ---


@staff_required
@require_http_methods(["GET", "POST"])
def staff_tenant_billing(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        raise Http404("Not found.")
    form = BillingProfileForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            billing_profile_update(
                tenant=tenant,
                user=request.user,  # type: ignore[arg-type]
                request=request,
                **form.cleaned_data,
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            messages.success(
                request,
                f"Billing settings of {tenant.name} saved; they apply from its next "
                "finalized invoice.",
            )
            return redirect("staff_tenant_detail", tenant_slug=tenant.slug)
    context = billing_panel_context(tenant, form if request.method == "POST" else None)
    return render(request, "billing/finance/staff_tenant_billing.html", context)
