"""Volume API shapes: what a volume reads as, and what creating or growing one takes."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.api.fields import (
    StrictCharField,
    StrictModelSerializer,
    StrictRegexField,
    StrictSlugField,
)
from storage.models import Volume, VolumeAccess, VolumeFill
from storage.selectors import latest_fill


class VolumeFillSerializer(StrictModelSerializer):
    files = serializers.IntegerField(source="files_done", read_only=True)

    class Meta:
        model = VolumeFill
        fields = [
            "status", "source", "bytes_done", "bytes_total", "files", "error",
            "created_at", "started_at", "finished_at", "attempt",
        ]  # fmt: skip
        extra_kwargs = {
            "attempt": {
                "help_text": "Runs of the copy so far: above 1 when it started again after "
                "its worker stopped (3 at most, then it fails)"
            }
        }
        read_only_fields = fields


class VolumeSerializer(StrictModelSerializer):
    region = StrictSlugField(source="region.slug", read_only=True)
    fill = serializers.SerializerMethodField(
        help_text="The latest fill (a copy into the volume), or null: status (queued, "
        "running, succeeded, failed, cancelled), bytes_done, bytes_total (null: not known "
        "yet), files, error (why it failed or was cancelled)"
    )

    class Meta:
        model = Volume
        fields = ["id", "name", "size_gib", "region", "access", "status", "created_at", "fill"]
        read_only_fields = fields

    @extend_schema_field(VolumeFillSerializer(allow_null=True))
    def get_fill(self, volume: Volume) -> dict | None:
        fill = latest_fill(volume)
        return None if fill is None else VolumeFillSerializer(fill).data


class VolumeFillStartSerializer(serializers.Serializer):
    source = StrictCharField(
        max_length=2000,
        help_text="An http(s):// URL (one file) or s3://bucket/prefix (each object under it)",
    )
    secret = StrictCharField(
        max_length=100,
        required=False,
        default="",
        allow_blank=True,
        help_text="An organisation secret by name: for s3://, ACCESS_KEY_ID:SECRET_ACCESS_KEY; "
        "for a URL, a bearer token",
    )
    endpoint = StrictCharField(
        max_length=400,
        required=False,
        default="",
        allow_blank=True,
        help_text="s3:// only: the S3-compatible service's URL (MinIO, Ceph…); empty: AWS",
    )


class VolumeCreateSerializer(serializers.Serializer):
    name = StrictRegexField(
        r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z",
        max_length=63,
        help_text="A DNS label: lower-case letters, digits and -, unique in the organisation",
    )
    size_gib = serializers.IntegerField(min_value=1, help_text="Size in GiB")
    region = StrictSlugField(max_length=40, help_text="Region slug, e.g. eu-west")
    access = serializers.ChoiceField(
        choices=VolumeAccess.choices,
        default=VolumeAccess.SINGLE_WRITER,
        help_text="single_writer: one job writes at a time; shared: many jobs mount it",
    )


class VolumeResizeSerializer(serializers.Serializer):
    size_gib = serializers.IntegerField(min_value=1, help_text="The new, larger size in GiB")
