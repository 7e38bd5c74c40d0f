from __future__ import annotations

from django import forms

from environments.models import Interactive
from environments.services import DEFAULT_HOME_GIB


class EnvironmentCreateForm(forms.Form):
    name = forms.CharField(
        max_length=63,
        help_text="Lower-case letters, digits and -, e.g. <code>research</code>: the SSH login "
        "is <code>&lt;name&gt;.&lt;organisation&gt;</code>.",
    )
    region = forms.ChoiceField(choices=[])
    image = forms.ChoiceField(choices=[])
    interactive = forms.ChoiceField(
        choices=Interactive.choices,
        initial=Interactive.BOTH,
        label="Connect with",
        help_text="SSH from your laptop (and IDEs over it), Jupyter in the browser, or both.",
    )
    cpus = forms.IntegerField(min_value=1, max_value=1024, required=False, label="CPUs")
    gpu_type = forms.ChoiceField(choices=[], required=False, label="GPU type")
    gpus_per_node = forms.IntegerField(min_value=0, max_value=64, initial=0, label="GPUs")
    home_volume = forms.ChoiceField(
        choices=[],
        required=False,
        help_text="Mounted at <code>/workspace</code>, kept when the environment stops. "
        "New: <code>&lt;name&gt;-home</code> is made with it.",
    )
    home_volume_gib = forms.IntegerField(
        min_value=1, initial=DEFAULT_HOME_GIB, label="New home volume size (GiB)"
    )

    def __init__(self, *args, regions, images, gpu_types, volumes, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["region"].choices = regions
        self.fields["image"].choices = images
        self.fields["gpu_type"].choices = [("", "None (CPU only)"), *gpu_types]
        self.fields["home_volume"].choices = [("", "A new volume"), *volumes]

    def clean(self):
        data = super().clean()
        data["gpu_type"] = data.get("gpu_type") or None
        data["home_volume"] = data.get("home_volume") or None
        return data
