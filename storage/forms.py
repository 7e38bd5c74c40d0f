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


class VolumeFillForm(forms.Form):
    source = forms.CharField(
        max_length=2000,
        help_text="An <code>https://</code> URL (one file) or <code>s3://bucket/prefix</code> "
        "(every object under it).",
    )
    endpoint = forms.CharField(
        max_length=400,
        required=False,
        label="S3 endpoint",
        help_text="For MinIO, Ceph or another S3-compatible service; empty for AWS.",
    )
    secret = forms.CharField(
        max_length=100,
        required=False,
        label="Credentials secret",
        help_text="An organisation secret's name: <code>ACCESS_KEY_ID:SECRET_ACCESS_KEY</code> "
        "for s3://, a bearer token for a URL.",
    )
