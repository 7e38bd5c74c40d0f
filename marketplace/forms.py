from __future__ import annotations

from decimal import Decimal

from django import forms
from django.utils import timezone

from marketplace.models import (
    AllowedRegistry,
    GpuType,
    ImageInteractive,
    ImageKind,
    NodePool,
    Region,
    Tier,
    Vendor,
)
from marketplace.pricing import MAX_NODES
from marketplace.recommend import Precision, Workload
from marketplace.services.catalog import GPU_TYPE_EDITABLE_FIELDS, NODE_POOL_EDITABLE_FIELDS

SORT_CHOICES = [
    ("price", "Price per GPU-hour"),
    ("price_per_tflop", "Price per PFLOP-hour"),
    ("availability", "Most available"),
]


class OfferFilterForm(forms.Form):
    """The catalog's filters. Its ids are its own ("filter-region"): the page also holds
    the estimate form, whose fields have the same names; the query string keeps the
    plain names, so links such as `?region=us-west` keep working."""

    vendor = forms.ChoiceField(choices=[("", "Any vendor"), *Vendor.choices], required=False)
    gpu_type = forms.ModelChoiceField(
        label="GPU type",
        queryset=GpuType.objects.filter(is_active=True),
        to_field_name="slug",
        required=False,
        empty_label="Any GPU type",
    )
    min_memory_gib = forms.IntegerField(label="Memory ≥ (GiB)", min_value=0, required=False)
    region = forms.ModelChoiceField(
        queryset=Region.objects.filter(is_active=True),
        to_field_name="slug",
        required=False,
        empty_label="Any region",
    )
    tier = forms.ChoiceField(choices=[("", "Any tier"), *Tier.choices], required=False)
    interconnect = forms.ChoiceField(
        choices=[("", "Any interconnect"), ("nvlink", "NVLink"), ("rdma", "RDMA network"),
                 ("infiniband", "InfiniBand")],
        required=False,
    )  # fmt: skip
    cpu_arch = forms.ChoiceField(
        label="CPU",
        choices=[("", "Any CPU"), ("amd64", "x86-64"), ("arm64", "ARM64")],
        required=False,
    )
    available = forms.BooleanField(label="Available now", required=False)
    sort = forms.ChoiceField(choices=SORT_CHOICES, required=False, initial="price")
    compact = forms.BooleanField(label="Compact view", required=False)

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("auto_id", "filter-%s")
        super().__init__(*args, **kwargs)


class EstimateForm(forms.Form):
    gpu_type = forms.ModelChoiceField(
        label="GPU type",
        queryset=GpuType.objects.filter(is_active=True),
        to_field_name="slug",
        required=False,
        empty_label="CPU only",
    )
    gpus_per_node = forms.IntegerField(
        label="GPUs per node", min_value=0, max_value=16, initial=8, required=False
    )
    cpus = forms.IntegerField(
        label="vCPUs per node", min_value=1, max_value=512, initial=8, required=False
    )
    # As many nodes as a launch may ask for (the one limit).
    nodes = forms.IntegerField(
        min_value=1,
        max_value=MAX_NODES,
        initial=1,
        error_messages={"min_value": "Must be at least 1 node."},
    )
    region = forms.ModelChoiceField(
        queryset=Region.objects.filter(is_active=True), to_field_name="slug", empty_label=None
    )
    # The spot ratio alone says which nodes are spot (as at launch); the tier prices the
    # others, so the two can't contradict each other.
    spot_ratio = forms.DecimalField(
        label="Spot ratio",
        min_value=Decimal(0),
        max_value=Decimal(1),
        initial="0",
        max_digits=4,
        decimal_places=3,
        help_text="Share of the nodes on spot, 0 to 1, in whole nodes.",
    )
    tier = forms.ChoiceField(
        label="Other nodes",
        choices=[(Tier.ON_DEMAND, Tier.ON_DEMAND.label), (Tier.RESERVED, Tier.RESERVED.label)],
        initial=Tier.ON_DEMAND,
    )
    reserved_months = forms.TypedChoiceField(
        label="Reserved term",
        choices=[(1, "1 month"), (3, "3 months"), (12, "12 months")],
        coerce=int,
        initial=1,
        required=False,
        empty_value=1,
    )
    hours = forms.DecimalField(
        min_value=Decimal("0.01"),
        max_value=Decimal(100000),
        initial=Decimal(24),
        max_digits=9,
        decimal_places=2,
    )


class RecommendForm(forms.Form):
    """The GPU recommender's inputs in the console (launch form and estimate page); the
    same bounds as the API's (marketplace.api.serializers.RecommendationRequestSerializer)."""

    prefix = "recommend"

    parameters_billion = forms.DecimalField(
        label="Model size (billion parameters)",
        min_value=Decimal("0.001"),
        max_value=Decimal(10_000),
        max_digits=9,
        decimal_places=3,
        initial=7,
    )
    workload = forms.ChoiceField(
        choices=[(w.value, w.label) for w in Workload], initial=Workload.LORA
    )
    precision = forms.ChoiceField(
        choices=[(p.value, p.value.upper()) for p in Precision],
        initial=Precision.BF16,
        help_text="Of the weights (QLoRA: int4 or int8).",
    )
    sequence_length = forms.IntegerField(
        label="Sequence length (tokens)", min_value=1, max_value=1_048_576, initial=2048
    )
    batch_size = forms.IntegerField(min_value=1, max_value=4096, initial=1)
    # A workload without a path at the precision is the service's refusal, shown beside
    # the precision (console.forms.add_service_error), not a second copy of the rule here.


class ImageFilterForm(forms.Form):
    q = forms.CharField(label="Search", required=False)
    kind = forms.ChoiceField(choices=[("", "Any kind"), *ImageKind.choices], required=False)
    vendor = forms.ChoiceField(
        choices=[("", "Any hardware"), *Vendor.choices, ("cpu", "CPU")], required=False
    )


class ImageForm(forms.Form):
    slug = forms.SlugField(max_length=80)
    name = forms.CharField(max_length=120)
    reference = forms.CharField(
        max_length=400, help_text="e.g. ghcr.io/acme/trainer:1.4.2 or …@sha256:<digest>"
    )
    kind = forms.ChoiceField(choices=ImageKind.choices)
    compatible_with = forms.MultipleChoiceField(
        choices=[*Vendor.choices, ("cpu", "CPU")],
        widget=forms.CheckboxSelectMultiple,
        initial=["nvidia"],
    )
    cuda_version = forms.CharField(label="CUDA version", max_length=20, required=False)
    rocm_version = forms.CharField(label="ROCm version", max_length=20, required=False)
    framework = forms.CharField(max_length=40, required=False)
    framework_version = forms.CharField(max_length=40, required=False)
    size_gib = forms.DecimalField(
        label="Size (GiB)", min_value=0, max_digits=6, decimal_places=1, initial=0
    )
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    default_command = forms.JSONField(
        required=False, initial=list, help_text='A JSON list, e.g. ["python", "train.py"]'
    )
    ports = forms.JSONField(
        required=False, initial=list, help_text='e.g. [{"name": "jupyter", "port": 8888}]'
    )
    interactive = forms.ChoiceField(
        choices=ImageInteractive.choices,
        required=False,
        label="Serves for dev environments",
        help_text="What the image runs itself: sshd, Jupyter or both (empty: a batch image).",
    )


class PriceVersionForm(forms.Form):
    effective = forms.ChoiceField(
        choices=[("now", "Now"), ("at", "At a later time")],
        initial="now",
        widget=forms.RadioSelect,
        label="Takes effect",
    )
    effective_from = forms.DateTimeField(
        required=False,
        label="Effective from (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Only for “At a later time”. Usage before this time keeps the old prices.",
    )
    currency = forms.CharField(max_length=3, initial="USD")
    spot_discount_percent = forms.DecimalField(
        min_value=0, max_value=Decimal("99.99"), max_digits=5, decimal_places=2
    )
    reserved_1m_discount_percent = forms.DecimalField(
        min_value=0, max_value=Decimal("99.99"), max_digits=5, decimal_places=2
    )
    reserved_3m_discount_percent = forms.DecimalField(
        min_value=0, max_value=Decimal("99.99"), max_digits=5, decimal_places=2
    )
    reserved_12m_discount_percent = forms.DecimalField(
        min_value=0, max_value=Decimal("99.99"), max_digits=5, decimal_places=2
    )
    note = forms.CharField(max_length=200, required=False)

    def clean(self):
        data = super().clean()
        now = timezone.now()
        if data.get("effective") == "now":
            data["effective_from"] = now
        elif data.get("effective") == "at":
            value = data.get("effective_from")
            if value is None:
                self.add_error("effective_from", "Give the time it takes effect, or choose Now.")
            elif value < now - timezone.timedelta(minutes=1):
                self.add_error(
                    "effective_from", "Pick now or a later time; past prices can't change."
                )
            else:
                data["effective_from"] = max(value, now)
        return data


class NewTenantPolicyForm(forms.Form):
    default_max_gpus = forms.IntegerField(
        min_value=0, required=False, label="GPUs at once", help_text="Empty: no limit."
    )
    default_max_concurrent_jobs = forms.IntegerField(
        min_value=0, required=False, label="Jobs at a time", help_text="Empty: no limit."
    )
    require_credit = forms.BooleanField(
        required=False,
        label="Require credit before the first launch",
        help_text="Only where Stripe is configured: an organisation launches once it has "
        "credit or has paid an invoice.",
    )


class TenantPricingForm(forms.Form):
    discount_percent = forms.DecimalField(
        min_value=0, max_value=Decimal("99.99"), max_digits=5, decimal_places=2
    )
    note = forms.CharField(max_length=200, required=False)


class FairShareForm(forms.Form):
    weight = forms.DecimalField(
        label="Fair-share weight",
        min_value=Decimal("0.01"),
        max_value=Decimal("100"),
        max_digits=5,
        decimal_places=2,
        help_text="1 for everyone by default; 2 gets twice the share of a shared pool.",
    )


class TenantQuotaForm(forms.Form):
    gpu_type = forms.ModelChoiceField(
        queryset=GpuType.objects.all(),
        to_field_name="slug",
        required=False,
        empty_label="All GPU types (tenant-wide)",
    )
    max_gpus = forms.IntegerField(label="Max GPUs", min_value=0, required=False)
    max_concurrent_jobs = forms.IntegerField(
        label="Max concurrent jobs", min_value=0, required=False
    )
    max_storage_gib = forms.IntegerField(
        min_value=0, required=False, label="Max storage (GiB of volumes, tenant-wide)"
    )


class GpuTypeForm(forms.ModelForm):
    class Meta:
        model = GpuType
        fields = list(GPU_TYPE_EDITABLE_FIELDS)


class NodePoolForm(forms.ModelForm):
    class Meta:
        model = NodePool
        fields = list(NODE_POOL_EDITABLE_FIELDS)


class AllowedRegistryForm(forms.Form):
    host = forms.CharField(max_length=253, help_text="e.g. ghcr.io or registry.example.com:5000")
    path_prefix = forms.CharField(
        max_length=200,
        required=False,
        help_text="Optional, e.g. acme/ to allow only that namespace",
    )
    note = forms.CharField(max_length=200, required=False)


class RegistryCredentialForm(forms.Form):
    """A login to an allow-listed registry; the password is never rendered back."""

    registry = forms.ChoiceField(help_text="An allow-listed registry host.")
    username = forms.CharField(
        max_length=200, widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"})
    )
    password = forms.CharField(
        label="Password or access token",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="Stored encrypted; never shown again. Saving a registry again replaces it.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        hosts = sorted(
            {host.lower() for host in AllowedRegistry.objects.values_list("host", flat=True)}
        )
        self.fields["registry"].choices = [(host, host) for host in hosts]
