from __future__ import annotations

from django import forms

from billing.charts import TIER_LABELS
from billing.selectors import GROUP_BY
from marketplace.models import GpuType, Region

GROUP_BY_LABELS = {
    "gpu_type": "GPU type",
    "job": "Job",
    "tier": "Tier",
    "region": "Region",
    "day": "Day",
    "project": "Project",
}
# The same in running text ("Daily cost by GPU type", "By project").
GROUP_BY_NOUNS = {
    key: label if key == "gpu_type" else label.lower() for key, label in GROUP_BY_LABELS.items()
}
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
        choices=[(k, GROUP_BY_LABELS[k]) for k in GROUP_BY],
    )
    # Choices, not free text: typing "A100" for the slug "a100-80gb" matched nothing and
    # showed 0.00 as if nothing had been spent.
    gpu_type = forms.ChoiceField(label="GPU type", required=False)
    region = forms.ChoiceField(required=False)
    tier = forms.ChoiceField(
        required=False,
        choices=[("", "Any tier"), *TIER_LABELS.items()],
    )
    job = forms.CharField(label="Job name contains", required=False, max_length=100)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Every GPU type and region there is (retired ones too: past usage ran on them).
        self.fields["gpu_type"].choices = [
            ("", "Any GPU type"),
            *((g.slug, str(g)) for g in GpuType.objects.order_by("vendor", "model")),
            ("cpu", "CPU only"),
        ]
        self.fields["region"].choices = [
            ("", "Any region"),
            *Region.objects.order_by("name").values_list("slug", "name"),
        ]
