from __future__ import annotations

from decimal import Decimal

from django import forms

from billing.models import BudgetAction
from billing.selectors import GROUP_BY

RANGE_CHOICES = [
    ("this_month", "This month"),
    ("last_month", "Last month"),
    ("last_7_days", "Last 7 days"),
    ("last_30_days", "Last 30 days"),
    ("last_90_days", "Last 90 days"),
    ("custom", "Custom"),
]


class CostFilterForm(forms.Form):
    range = forms.ChoiceField(choices=RANGE_CHOICES, initial="this_month", required=False)
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    group_by = forms.ChoiceField(
        label="Group by",
        required=False,
        initial="gpu_type",
        choices=[(k, k.replace("_", " ").title()) for k in GROUP_BY],
    )
    gpu_type = forms.CharField(label="GPU type", required=False, max_length=40)
    region = forms.CharField(required=False, max_length=40)
    tier = forms.ChoiceField(
        required=False,
        choices=[
            ("", "Any tier"),
            ("on_demand", "On-demand"),
            ("spot", "Spot"),
            ("reserved", "Reserved"),
        ],
    )
    job = forms.CharField(label="Job name contains", required=False, max_length=100)


class BudgetForm(forms.Form):
    name = forms.CharField(max_length=100)
    amount = forms.DecimalField(
        min_value=Decimal("0.000001"),
        max_digits=18,
        decimal_places=6,
        help_text="Per calendar month",
    )
    thresholds = forms.CharField(
        initial="50, 80, 100", help_text="Percents that alert, comma-separated (1–200)"
    )
    action = forms.ChoiceField(choices=BudgetAction.choices)
    project = forms.CharField(
        max_length=100, required=False, help_text="Only this project's jobs; empty for all"
    )
    webhook_url = forms.URLField(
        required=False,
        assume_scheme="https",
        label="Webhook URL (optional)",
        help_text="Signed with X-GpuGeek-Signature (HMAC-SHA256)",
    )

    def clean_thresholds(self):
        try:
            return [
                int(part)
                for part in self.cleaned_data["thresholds"].replace(" ", "").split(",")
                if part
            ]
        except ValueError:
            raise forms.ValidationError(
                "Whole percents separated by commas, e.g. 50, 80, 100."
            ) from None
