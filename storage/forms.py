from __future__ import annotations

from django import forms

from storage.models import VolumeAccess


class VolumeCreateForm(forms.Form):
    name = forms.CharField(
        max_length=63, help_text="Lower-case letters, digits and -, e.g. <code>datasets</code>."
    )
    size_gib = forms.IntegerField(min_value=1, label="Size (GiB)")
    region = forms.ChoiceField(choices=[])
    access = forms.ChoiceField(
        choices=VolumeAccess.choices,
        initial=VolumeAccess.SINGLE_WRITER,
        help_text="Single writer: one job at a time writes; others may mount it read-only. "
        "Shared: many jobs mount it at once.",
    )

    def __init__(self, *args, regions: list[tuple[str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["region"].choices = regions


class VolumeResizeForm(forms.Form):
    size_gib = forms.IntegerField(min_value=1, label="New size (GiB)")
