"""Volume API shapes: what a volume reads as, and what creating or growing one takes."""

from __future__ import annotations

from rest_framework import serializers

from console.api.fields import StrictModelSerializer, StrictRegexField, StrictSlugField
from storage.models import Volume, VolumeAccess


class VolumeSerializer(StrictModelSerializer):
    region = StrictSlugField(source="region.slug", read_only=True)

    class Meta:
        model = Volume
        fields = ["id", "name", "size_gib", "region", "access", "status", "created_at"]
        read_only_fields = fields


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
