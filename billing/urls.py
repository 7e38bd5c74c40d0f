from django.urls import path

from billing import views
from billing.budgets import views as budget_views
from billing.finance import views as finance_views
from billing.invoices import views as invoice_views
from billing.payments import views as payment_views

app_name = "billing"

urlpatterns = [
    path("costs/", views.costs, name="costs"),
    path("costs/export.csv", views.costs_export, name="costs_export"),
    path("budgets/", budget_views.budgets, name="budgets"),
    path("budgets/<int:budget_id>/", budget_views.budget_edit, name="budget_edit"),
    path("budgets/<int:budget_id>/delete/", budget_views.budget_delete, name="budget_delete"),
    path(
        "budgets/<int:budget_id>/rotate-webhook-secret/",
        budget_views.budget_rotate_webhook_secret,
        name="budget_rotate_webhook_secret",
    ),
    path("invoices/", invoice_views.invoices, name="invoices"),
    path("invoices/<int:invoice_id>/", invoice_views.invoice_detail, name="invoice_detail"),
    path(
        "invoices/<int:invoice_id>/lines.csv",
        invoice_views.invoice_lines_csv,
        name="invoice_lines_csv",
    ),
    path(
        "invoices/<int:invoice_id>/invoice.pdf",
        invoice_views.invoice_pdf_download,
        name="invoice_pdf",
    ),
    path("finance/", finance_views.finance_invoices, name="finance_invoices"),
    path("finance/invoices.csv", finance_views.finance_invoices_csv, name="finance_invoices_csv"),
    path("finance/revenue/", finance_views.finance_revenue, name="finance_revenue"),
    path(
        "staff/tenants/<slug:tenant_slug>/billing/",
        finance_views.staff_tenant_billing,
        name="staff_tenant_billing",
    ),
    path("credit/", payment_views.credit, name="credit"),
    path("credit/buy/", payment_views.credit_buy, name="credit_buy"),
    # Stripe's deliveries: signed, no session (see billing/payments/webhook.py).
    path("stripe/webhook/", payment_views.stripe_webhook, name="stripe_webhook"),
    path("staff/invoices/", invoice_views.staff_invoices, name="staff_invoices"),
    path(
        "staff/invoices/mismatches/",
        invoice_views.staff_invoice_mismatches,
        name="staff_invoice_mismatches",
    ),
    path(
        "staff/invoices/<int:invoice_id>/",
        invoice_views.staff_invoice_detail,
        name="staff_invoice_detail",
    ),
    path(
        "staff/invoices/<int:invoice_id>/adjustment/",
        invoice_views.staff_invoice_adjustment,
        name="staff_invoice_adjustment",
    ),
    path(
        "staff/invoices/<int:invoice_id>/credit-note/",
        invoice_views.staff_invoice_credit_note,
        name="staff_invoice_credit_note",
    ),
    path(
        "staff/invoices/<int:invoice_id>/<str:action>/",
        invoice_views.staff_invoice_action,
        name="staff_invoice_action",
    ),
]
