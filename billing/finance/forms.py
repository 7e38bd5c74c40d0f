"""Forms of the finance console (filters) and of the staff's billing settings of a tenant."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from django import forms

from billing.models import InvoiceStatus
from billing.profiles import MAX_PAYMENT_TERMS_DAYS, MAX_TAX_PERCENT
from console.models import Tenant

MAX_MONTHS = 24


class MonthField(forms.DateField):
    """A month, typed as YYYY-MM (a browser's month input): its first day."""

    input_formats = ["%Y-%m"]
    widget = forms.DateInput(attrs={"type": "month"}, format="%Y-%m")


class _FinanceFilterForm(forms.Form):
    """The tenant filter exists only for platform staff: for anyone else it is not a
    field at all, so a `?tenant=` in the URL is ignored."""

    period_from = MonthField(label="From month", required=False)
    period_to = MonthField(label="To month", required=False)
    tenant = forms.ModelChoiceField(
        Tenant.objects.order_by("name"),
        to_field_name="slug",
        required=False,
        empty_label="All organisations",
        label="Organisation",
    )

    def __init__(self, *args, staff: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not staff:
            del self.fields["tenant"]

    def clean(self) -> dict:
        data = super().clean()
        start: date | None = data.get("period_from")
        end: date | None = data.get("period_to")
        if start and end and end < start:
            self.add_error("period_to", "The last month is before the first.")
        return data


class InvoiceFilterForm(_FinanceFilterForm):
    field_order = ["status", "period_from", "period_to", "tenant", "overdue"]

    status = forms.ChoiceField(choices=[("", "Any status"), *InvoiceStatus.choices], required=False)
    overdue = forms.BooleanField(label="Overdue only", required=False)


class RevenueFilterForm(_FinanceFilterForm):
    currency = forms.RegexField(
        regex=r"^[A-Z]{3}$",
        required=False,
        max_length=3,
        help_text="Empty: the currency with most revenue",
    )

    def clean(self) -> dict:
        data = super().clean()
        start, end = data.get("period_from"), data.get("period_to")
        if start and end and (end.year - start.year) * 12 + end.month - start.month >= MAX_MONTHS:
            self.add_error("period_to", f"Show at most {MAX_MONTHS} months at once.")
        return data


class BillingProfileForm(forms.Form):
    tax_rate_percent = forms.DecimalField(
        label="Tax rate (%)",
        min_value=Decimal(0),
        max_value=MAX_TAX_PERCENT,
        max_digits=6,
        decimal_places=3,
    )
    tax_label = forms.CharField(max_length=40, help_text="Shown on invoices, e.g. VAT")
    payment_terms_days = forms.IntegerField(
        label="Payment terms (days)",
        min_value=0,
        max_value=MAX_PAYMENT_TERMS_DAYS,
        help_text="Days from finalization until an invoice is due",
    )
