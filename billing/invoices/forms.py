"""Forms of the invoice pages (staff adjustments and credit notes, on-demand drafts)."""

from __future__ import annotations

from django import forms

from console.models import Tenant


class AdjustmentForm(forms.Form):
    description = forms.CharField(max_length=300)
    amount = forms.DecimalField(max_digits=18, decimal_places=9, help_text="Negative: a credit")
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}))


class CreditNoteForm(forms.Form):
    amount = forms.DecimalField(max_digits=18, decimal_places=2, min_value=0)
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}))


class DraftForm(forms.Form):
    tenant = forms.ModelChoiceField(Tenant.objects.order_by("name"), to_field_name="slug")
    period_start = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}))
    period_end = forms.DateField(
        widget=forms.DateInput(attrs={"type": "date"}), help_text="Exclusive"
    )
