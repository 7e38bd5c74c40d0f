"""The budget form of the budgets page and the edit page."""

from __future__ import annotations

from decimal import Decimal

from django import forms

from billing.models import BudgetAction


class BudgetForm(forms.Form):
    name = forms.CharField(max_length=100)
    # No min_value: its message (and the browser's) would read "≥ 0.000001" (the
    # column's quantum) where people mean "more than nothing" (clean_amount).
    amount = forms.DecimalField(
        max_digits=18,
        decimal_places=6,
        help_text="Per calendar month",
        widget=forms.NumberInput(attrs={"min": "0", "step": "any"}),
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

    def clean_amount(self) -> Decimal:
        amount = self.cleaned_data["amount"]
        if amount <= 0:
            raise forms.ValidationError("Must be more than 0.")
        return amount

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
