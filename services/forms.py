"""Forms of the services pages: what a person types, turned into a ServiceSpec."""

from __future__ import annotations

import shlex

from django import forms

from jobs.models import Priority
from marketplace.selectors import regions_active
from services import selectors
from services.models import AutoscaleMetric, ServiceAuth
from services.services import ServiceSpec


class ServiceForm(forms.Form):
    name = forms.CharField(max_length=63, help_text="Lowercase letters, digits and hyphens.")
    image = forms.CharField(max_length=300, initial="python:3.11-slim")
    command = forms.CharField(
        max_length=4000,
        help_text="As you would type it, e.g. python3 -m http.server (PORT is set for you).",
    )
    port = forms.IntegerField(min_value=1, max_value=65535, initial=8080, label="Port")
    region = forms.ChoiceField()
    cpus = forms.IntegerField(min_value=1, max_value=1024, initial=1, label="CPUs per replica")
    gpu_type = forms.ChoiceField(
        required=False,
        label="GPU type",
        help_text="GPU replicas run on the region's cluster; leave empty for CPU.",
    )
    gpus_per_replica = forms.IntegerField(
        min_value=0,
        max_value=64,
        required=False,
        label="GPUs per replica",
        help_text="1 by default once a GPU type is chosen.",
    )
    min_replicas = forms.IntegerField(min_value=0, initial=2, label="Minimum replicas")
    max_replicas = forms.IntegerField(min_value=1, initial=10, label="Maximum replicas")
    autoscale_metric = forms.ChoiceField(
        choices=AutoscaleMetric.choices, initial=AutoscaleMetric.CONCURRENCY, label="Scale on"
    )
    autoscale_target = forms.FloatField(
        min_value=0.01, max_value=100_000, initial=10, label="Target per replica"
    )
    scale_down_delay = forms.IntegerField(
        min_value=0,
        max_value=3600,
        initial=300,
        required=False,
        label="Scale-down delay (s)",
        help_text="How long the traffic must want fewer replicas before one is stopped.",
    )
    readiness_path = forms.CharField(max_length=200, initial="/", label="Readiness path")
    auth = forms.ChoiceField(choices=ServiceAuth.choices, initial=ServiceAuth.TOKEN)
    priority = forms.ChoiceField(
        choices=Priority.choices,
        initial=Priority.NORMAL,
        required=False,
        help_text="Critical (owners and admins) keeps serving when a budget is used up; "
        "others scale to zero until it is raised.",
    )
    env = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        label="Environment",
        help_text="One NAME=value per line.",
    )
    secrets = forms.CharField(
        required=False,
        max_length=2000,
        label="Organisation secrets",
        help_text="Names of your organisation's secrets, separated by spaces or commas: "
        "each replica gets their values as environment variables.",
    )

    volumes = forms.CharField(
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Volumes (read-only)",
        help_text="One NAME:/path per line, e.g. weights:/models: your organisation's "
        "volumes in the service's region, mounted read-only in every replica.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["region"].choices = [(r.slug, r.name) for r in regions_active()]
        self.fields["gpu_type"].choices = [("", "None (CPU)")] + [
            (gpu.slug, str(gpu)) for gpu in selectors.gpu_types_for_services()
        ]

    def clean_command(self) -> list[str]:
        try:
            words = shlex.split(self.cleaned_data["command"])
        except ValueError as error:
            raise forms.ValidationError(f"The command can't be read: {error}.") from None
        if not words:
            raise forms.ValidationError("Give the command that starts your server.")
        return words

    def clean_scale_down_delay(self) -> int:
        delay = self.cleaned_data["scale_down_delay"]
        return ServiceSpec.scale_down_delay if delay is None else delay

    def clean_priority(self) -> str:
        return self.cleaned_data["priority"] or ServiceSpec.priority

    def clean_env(self) -> dict[str, str]:
        env = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), 1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(f"Line {number} is not NAME=value.")
            env[name.strip()] = value
        return env

    def clean_secrets(self) -> list[str]:
        return [name for name in self.cleaned_data["secrets"].replace(",", " ").split() if name]

    def clean_gpu_type(self) -> str | None:
        return self.cleaned_data["gpu_type"] or None

    def clean_gpus_per_replica(self) -> int:
        return self.cleaned_data["gpus_per_replica"] or 0

    def clean_volumes(self) -> list[dict]:
        mounts = []
        for number, line in enumerate(self.cleaned_data["volumes"].splitlines(), 1):
            if not line.strip():
                continue
            name, sep, path = line.strip().partition(":")
            if not sep or not name or not path:
                raise forms.ValidationError(f"Line {number} is not NAME:/path.")
            mounts.append({"name": name.strip(), "path": path.strip()})
        return mounts

    def to_spec(self) -> ServiceSpec:
        return ServiceSpec(**self.cleaned_data)


class ServiceTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Who uses it, e.g. “web-frontend”.")
