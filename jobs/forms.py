from __future__ import annotations

import math
import shlex
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms

from jobs.launch_options import launch_choices, launch_images
from jobs.models import Priority, TenantSecret
from jobs.services.placement import REQUIREMENT_VALUES
from jobs.services.spec import DEFAULT_MAX_RUNTIME_MINUTES, JobSpec
from marketplace.models import GpuType, Image, Region, Tier
from marketplace.pricing import MAX_NODES
from marketplace.selectors import regions_for_tenant


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


LAUNCH_CHOICE_FIELDS = ("gpu_type", "gpus_per_node", "cpus", "nodes", "region", "spot_ratio",
                        "image", "priority", "volumes", "max_runtime_minutes")  # fmt: skip
MAX_RUNTIME_MINUTES = 60 * 24 * 90


def _link_int(params, names: tuple[str, ...], label: str, low: int, high: int, notes: list[str]):
    for name in names:
        value = params.get(name, "").strip()
        if not value:
            continue
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or not low <= number <= high:
            notes.append(f"Ignored {name}={value[:20]}: {label} is a whole number from {low} "
                         f"to {high}.")  # fmt: skip
            return None
        return number
    return None


def initial_from_link(params) -> tuple[dict[str, Any], list[str]]:
    """A launch link's choices (an offer's or an estimate's "Launch this"): gpu_type,
    region, tier (on_demand or spot), gpus_per_node, nodes (or count), spot_ratio, image,
    hours (the maximum runtime). Values that can't be read are ignored with a note;
    `launch_choices` then says what doesn't exist here."""
    initial: dict[str, Any] = {}
    notes: list[str] = []
    for name in ("gpu_type", "region", "image"):
        value = params.get(name, "").strip()
        if value:
            initial[name] = value[:100]
    tier = params.get("tier", "").strip()
    if tier in (Tier.ON_DEMAND, Tier.SPOT):
        initial["spot_ratio"] = Decimal(1) if tier == Tier.SPOT else Decimal(0)
    elif tier:
        notes.append(f"Ignored tier={tier[:20]}: launches are on_demand or spot.")
    ratio = params.get("spot_ratio", "").strip()
    if ratio:
        try:
            value = Decimal(ratio)
        except InvalidOperation:
            value = Decimal(-1)
        if value.is_finite() and Decimal(0) <= value <= Decimal(1):
            initial["spot_ratio"] = value
        else:
            notes.append(f"Ignored spot_ratio={ratio[:20]}: a spot ratio is from 0 to 1.")
    for field_name, names, label, high in (
        ("nodes", ("nodes", "count"), "the node count", 1024),
        ("gpus_per_node", ("gpus_per_node",), "GPUs per node", 64),
        ("cpus", ("cpus",), "vCPUs per node", 1024),
    ):
        number = _link_int(params, names, label, 1, high, notes)
        if number is not None:
            initial[field_name] = number
    hours = params.get("hours", "").strip()
    if hours:
        try:
            minutes = math.ceil(Decimal(hours) * 60)
        except (InvalidOperation, ValueError, OverflowError):
            minutes = 0
        if 1 <= minutes <= MAX_RUNTIME_MINUTES:
            initial["max_runtime_minutes"] = minutes
        else:
            notes.append(f"Ignored hours={hours[:20]}: the maximum runtime is up to 90 days.")
    return initial, notes


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
    # Other places the job may run (spec `regions` / `gpu_types` with the choice above):
    # the launch takes the cheapest, weighted by data locality, and says so on the timeline.
    regions = forms.ModelMultipleChoiceField(
        label="Also acceptable regions",
        queryset=Region.objects.none(),
        to_field_name="slug",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="The launch runs where its price is lowest, a pool in the data region "
        "counting its price divided by the pool's locality weight (1.5 unless staff set "
        "another).",
    )
    gpu_types = forms.ModelMultipleChoiceField(
        label="Also acceptable GPU types",
        queryset=GpuType.objects.none(),
        to_field_name="slug",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Chosen the same way, with the GPUs per node above.",
    )
    data_region = forms.ModelChoiceField(
        label="Data region",
        queryset=Region.objects.none(),
        to_field_name="slug",
        required=False,
        empty_label="Not said",
        help_text="Where the data it reads lives (a bucket's region). With volumes, theirs.",
    )
    interconnect = forms.ChoiceField(
        label="Requires interconnect",
        choices=[("", "Any"), *((v, v) for v in REQUIREMENT_VALUES["interconnect"])],
        required=False,
        help_text="Only pools whose nodes have it.",
    )
    cpu_arch = forms.ChoiceField(
        label="Requires CPU architecture",
        choices=[("", "Any"), *((v, v) for v in REQUIREMENT_VALUES["cpu_arch"])],
        required=False,
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
        max_value=MAX_RUNTIME_MINUTES,
        initial=DEFAULT_MAX_RUNTIME_MINUTES,
    )
    checkpoint_path = forms.CharField(max_length=400, required=False)
    gpu_memory_gib = forms.IntegerField(
        label="GPU memory needed per GPU (GiB)",
        min_value=1,
        max_value=4096,
        required=False,
        help_text="Optional. The job then runs only where it fits with the pool's memory "
        "margin kept free (20 % unless staff set another); empty: not checked.",
    )
    auto_release = forms.BooleanField(
        label="Release compute when it finishes", required=False, initial=True
    )

    def __init__(self, *args, tenant=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["image"].queryset = Image.objects.filter(
            pk__in=[image.pk for image in launch_images(tenant=tenant)]
        )
        # "This host" is offered only to tenants staff allow to run on it.
        for name in ("region", "regions", "data_region"):
            self.fields[name].queryset = regions_for_tenant(tenant)
        # What the form offers for the values it has; clean() accepts only these.
        self.choices = launch_choices(tenant=tenant, **self._asked())
        self.fields["gpu_types"].queryset = GpuType.objects.filter(
            pk__in=[gpu.pk for gpu in self.choices.gpu_types]
        )
        if not self.is_bound:
            self.initial.update(
                gpu_type=self.choices.gpu_type.slug if self.choices.gpu_type else "",
                region=self.choices.region.slug if self.choices.region else None,
                gpus_per_node=self.choices.gpus_per_node,
                spot_ratio=self.choices.spot_ratio,
                image=self.choices.image.slug if self.choices.image else None,
            )
        self.fields["gpus_per_node"].widget = forms.Select(
            choices=[(n, str(n)) for n in self.choices.gpus_per_node_choices]
        )
        # The fields the dependent choices, the capacity and the estimate follow (htmx
        # sends only these: never the command or the secrets).
        for name in LAUNCH_CHOICE_FIELDS:
            self.fields[name].widget.attrs["data-launch-choice"] = ""
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
            "gpu_memory_gib": spec.gpu_memory_gib,
            "interconnect": spec.requirements.get("interconnect", ""),
            "cpu_arch": spec.requirements.get("cpu_arch", ""),
            "volumes": "\n".join(
                f"{m['name']}:{m['path']}{':ro' if m.get('read_only') else ''}"
                for m in spec.volumes
            ),
        }

    def _asked(self) -> dict[str, Any]:
        """The values the dependent choices follow: posted, else initial."""
        names = ("gpu_type", "region", "gpus_per_node", "nodes", "spot_ratio", "image", "cpus",
                 "priority")  # fmt: skip
        if self.is_bound:
            return {name: self.data.get(self.add_prefix(name)) for name in names}
        return {name: self.initial.get(name) for name in names}

    def clean(self):
        """Only what exists: the choices as asked must be what `launch_choices` resolves
        them to (it never changes a combination that exists)."""
        data = super().clean()
        choices = self.choices
        hardware = choices.hardware_label
        gpus_missing = self._asked().get("gpu_type") and not data.get("gpus_per_node")
        if gpus_missing and "gpus_per_node" not in self.errors:
            self.add_error("gpus_per_node", "A GPU job needs at least one GPU per node.")
        if data.get("gpu_type") and data["gpu_type"] != choices.gpu_type:
            self.add_error("gpu_type", f"{data['gpu_type'].model} is not offered for launch here.")
            return data
        if not data.get("gpu_type") and not choices.cpu_offered and "gpu_type" not in self.errors:
            self.add_error("gpu_type", "CPU-only jobs are not offered here; choose a GPU type.")
            return data
        region = data.get("region")
        if region and region != choices.region:
            offered = ", ".join(r.name for r in choices.regions) or "none"
            self.add_error(
                "region",
                f"No {hardware} pool in {region.name} on this installation's "
                f"backends; {hardware} is offered in: {offered}.",
            )
            return data
        ratio = data.get("spot_ratio")
        if ratio is not None and choices.split is not None and ratio != choices.spot_ratio:
            only = "spot" if choices.spot_only else "on-demand"
            self.add_error(
                "spot_ratio",
                f"{hardware} in {choices.region.name} is {only} only: the spot ratio must be "
                f"{choices.spot_ratio}.",
            )
        gpus = data.get("gpus_per_node")
        if data.get("gpu_type") and gpus and gpus not in choices.gpus_per_node_choices:
            self.add_error(
                "gpus_per_node",
                f"Nodes of {hardware} in {choices.region.name} have "
                f"{max(choices.gpus_per_node_choices, default=0)} GPUs: choose 1 to "
                f"{max(choices.gpus_per_node_choices, default=0)}.",
            )
        return data

    def placement(self) -> dict[str, Any]:
        """The spec's where and what on (cleaned data): one region and GPU type, or, with
        others also acceptable, the lists of all of them; the data region; requirements."""
        data = self.cleaned_data
        region, gpu_type = data["region"].slug, data["gpu_type"].slug if data["gpu_type"] else None
        regions = list(dict.fromkeys([region, *(r.slug for r in data["regions"])]))
        gpu_types = list(dict.fromkeys([gpu_type, *(g.slug for g in data["gpu_types"])]))
        requirements = {name: data[name] for name in REQUIREMENT_VALUES if data.get(name)}
        return {
            **({"regions": regions} if len(regions) > 1 else {"region": region}),
            **({"gpu_types": gpu_types} if len(gpu_types) > 1 else {"gpu_type": gpu_type}),
            "data_region": data["data_region"].slug if data["data_region"] else None,
            "requirements": requirements,
        }

    def clean_gpu_types(self):
        if self.cleaned_data["gpu_types"] and not self._asked().get("gpu_type"):
            raise forms.ValidationError("A CPU-only job runs on CPUs: choose a GPU type first.")
        return self.cleaned_data["gpu_types"]

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
