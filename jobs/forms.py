from __future__ import annotations

import shlex
from decimal import Decimal
from typing import Any

from django import forms

from jobs.models import Priority, TenantSecret
from jobs.services.spec import DEFAULT_MAX_RUNTIME_MINUTES, JobSpec
from marketplace.models import GpuType, Image, Region
from marketplace.pricing import MAX_NODES
from marketplace.selectors import default_region, regions_for_tenant


def parse_pairs(text: str, field_label: str) -> dict[str, str]:
    """KEY=value lines (blank lines and # comments ignored)."""
    pairs = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise forms.ValidationError(f"{field_label} line {number}: write NAME=value.")
        key, value = line.split("=", 1)
        pairs[key.strip()] = value
    return pairs


def parse_volume_lines(text: str) -> list[dict]:
    """`name:/path` or `name:/path:ro` lines (as the CLI's --volume) into spec mounts."""
    mounts = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(":")
        path, read_only = rest, False
        if rest.endswith((":ro", ":rw")):
            path, read_only = rest[:-3], rest.endswith(":ro")
        if not name or not path:
            raise forms.ValidationError(
                f"Volumes line {number}: write name:/path or name:/path:ro."
            )
        mounts.append({"name": name.strip(), "path": path.strip(), "read_only": read_only})
    return mounts


class LaunchForm(forms.Form):
    name = forms.CharField(max_length=100)
    project = forms.CharField(max_length=100, required=False)
    gpu_type = forms.ModelChoiceField(
        label="GPU type",
        queryset=GpuType.objects.filter(is_active=True),
        to_field_name="slug",
        required=False,
        empty_label="CPU only",
    )
    gpus_per_node = forms.IntegerField(label="GPUs per node", min_value=0, max_value=64, initial=0)
    cpus = forms.IntegerField(label="vCPUs per node", min_value=1, max_value=1024, initial=1)
    nodes = forms.IntegerField(min_value=1, max_value=MAX_NODES, initial=1)
    region = forms.ModelChoiceField(
        queryset=Region.objects.filter(is_active=True), to_field_name="slug", empty_label=None
    )
    spot_ratio = forms.DecimalField(
        min_value=Decimal(0),
        max_value=Decimal(1),
        initial="0",
        max_digits=4,
        decimal_places=3,
        help_text="Share of nodes on spot capacity (cheaper, can be reclaimed), in whole "
        "nodes: the estimate shows the split.",
    )
    image = forms.ModelChoiceField(queryset=Image.objects.none(), to_field_name="slug")
    command = forms.CharField(
        max_length=4000,
        widget=forms.TextInput(
            attrs={"placeholder": "python train.py --epochs 3", "spellcheck": "false"}
        ),
        help_text="Split into arguments like a shell would, but never run through one.",
    )
    env = forms.CharField(
        label="Environment",
        required=False,
        widget=forms.Textarea(
            attrs={"rows": 2, "placeholder": "BATCH_SIZE=64", "spellcheck": "false"}
        ),
    )
    secret_env = forms.CharField(
        label="Secret environment",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "HF_TOKEN=…"}),
        help_text="Stored encrypted; never shown again.",
    )
    secrets = forms.MultipleChoiceField(
        label="Organisation secrets",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Injected as environment variables of the same name.",
    )
    expose_ports = forms.BooleanField(
        label="Expose the image's ports (Jupyter, SSH)",
        required=False,
        help_text="Reachable through the job's Service (cluster) or on this host (local).",
    )
    volumes = forms.CharField(
        label="Volumes",
        required=False,
        widget=forms.Textarea(
            attrs={"rows": 2, "placeholder": "data:/data", "spellcheck": "false"}
        ),
        help_text="One per line: name:/path, or name:/path:ro to mount read-only. Volumes "
        "are on the Storage page and usable only in their region.",
    )
    priority = forms.ChoiceField(choices=Priority.choices, initial=Priority.NORMAL)
    max_runtime_minutes = forms.IntegerField(
        label="Max runtime (minutes)",
        min_value=1,
        max_value=60 * 24 * 90,
        initial=DEFAULT_MAX_RUNTIME_MINUTES,
    )
    checkpoint_path = forms.CharField(max_length=400, required=False)
    auto_release = forms.BooleanField(
        label="Release compute when it finishes", required=False, initial=True
    )

    def __init__(self, *args, tenant=None, **kwargs):
        super().__init__(*args, **kwargs)
        # A private image whose slug a public one has (made before such clashes were
        # refused) is left out: the slug names the public image, here and in the spec.
        active = Image.objects.for_tenant(tenant).filter(is_active=True)
        public_slugs = active.filter(tenant__isnull=True).values("slug")
        self.fields["image"].queryset = active.exclude(tenant__isnull=False, slug__in=public_slugs)
        # "This host" is offered only to tenants staff allow to run on it.
        regions = regions_for_tenant(tenant)
        self.fields["region"].queryset = regions
        if not regions.filter(slug=self.initial.get("region") or "").exists():
            region = default_region(tenant)
            self.initial["region"] = region.slug if region else None
        self.fields["secrets"].choices = [
            (name, name)
            for name in TenantSecret.objects.for_tenant(tenant).values_list("name", flat=True)
        ]

    @staticmethod
    def initial_from_spec(spec: JobSpec) -> dict[str, Any]:
        """The form's initial values for a spec (a template, or a job to launch again).
        Secret values are never put back into a form."""
        return {
            "name": spec.name,
            "project": spec.project,
            "gpu_type": spec.gpu_type,
            "gpus_per_node": spec.gpus_per_node,
            "cpus": spec.cpus,
            "nodes": spec.nodes,
            "region": spec.region,
            "spot_ratio": spec.spot_ratio,
            "image": spec.image,
            "command": shlex.join(spec.command),
            "priority": spec.priority,
            "env": "\n".join(f"{key}={value}" for key, value in spec.env.items()),
            "max_runtime_minutes": spec.max_runtime_minutes,
            "checkpoint_path": spec.checkpoint_path,
            "volumes": "\n".join(
                f"{m['name']}:{m['path']}{':ro' if m.get('read_only') else ''}"
                for m in spec.volumes
            ),
        }

    def clean_command(self):
        try:
            argv = shlex.split(self.cleaned_data["command"])
        except ValueError as error:
            raise forms.ValidationError(f"Unbalanced quotes: {error}.") from None
        if not argv:
            raise forms.ValidationError("Give a command to run.")
        return argv

    def clean_volumes(self):
        return parse_volume_lines(self.cleaned_data["volumes"])

    def clean_env(self):
        return parse_pairs(self.cleaned_data["env"], "Environment")

    def clean_secret_env(self):
        return parse_pairs(self.cleaned_data["secret_env"], "Secret environment")


class TenantSecretForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        widget=forms.TextInput(
            attrs={"placeholder": "HF_TOKEN", "autocomplete": "off", "spellcheck": "false"}
        ),
    )
    value = forms.CharField(
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        strip=False,
        help_text="Stored encrypted; never shown again. Saving an existing name replaces it.",
    )
    projects = forms.CharField(
        label="Only in projects",
        required=False,
        widget=forms.TextInput(
            attrs={"placeholder": "llm-finetune, vision", "spellcheck": "false"}
        ),
        help_text="Comma-separated. Empty: jobs of any project may use it.",
    )
    members_may_use = forms.BooleanField(
        label="Members' jobs may use it",
        required=False,
        help_text="Off: only owners' and admins' jobs may use it. A job that can use a "
        "secret can read it.",
    )

    def clean_projects(self) -> list[str]:
        return [p.strip() for p in self.cleaned_data["projects"].split(",") if p.strip()]
