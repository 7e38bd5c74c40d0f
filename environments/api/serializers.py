"""Environment API shapes: what an environment reads as, and what creating or changing one
takes (validated again by environments.services, which owns the rules)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.api.fields import (
    StrictCharField,
    StrictModelSerializer,
    StrictRegexField,
    StrictSlugField,
)
from environments import jupyter, selectors
from environments.models import Environment, Interactive
from environments.services import DEFAULT_HOME_GIB, KEEP_ALIVE_MAX_MINUTES
from jobs.api.serializers import VolumeMountSerializer

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z"


class EnvironmentSerializer(StrictModelSerializer):
    region = StrictSlugField(source="region.slug", read_only=True)
    gpu_type = StrictSlugField(source="gpu_type.slug", read_only=True, allow_null=True)
    home_volume = StrictCharField(
        source="home_volume.name", read_only=True, help_text="Mounted read-write at /workspace"
    )
    current_job = serializers.IntegerField(
        source="current_job_id", read_only=True, allow_null=True, help_text="The job running it"
    )
    ssh_command = serializers.SerializerMethodField(
        help_text="The command line to paste (empty for a Jupyter-only environment)"
    )
    jupyter_url = serializers.SerializerMethodField(
        help_text="Where its Jupyter opens in a browser signed in to the console (empty "
        "without Jupyter)"
    )
    ssh_config = serializers.SerializerMethodField(help_text="An ~/.ssh/config entry")
    ssh_host_key_fingerprint = serializers.SerializerMethodField(
        help_text="SHA256 fingerprint of its sshd's host key (the same across starts)"
    )
    ssh_known_hosts = serializers.SerializerMethodField(
        help_text="Its host key as a ~/.ssh/known_hosts line"
    )
    scheduled_deletion_at = serializers.SerializerMethodField(
        help_text="Stopped, with an idle policy's delete_after_stopped_days: when it and its "
        "home volume are deleted at the earliest (null: kept)"
    )

    class Meta:
        model = Environment
        fields = [
            "id", "name", "region", "gpu_type", "gpus_per_node", "cpus", "image",
            "interactive", "home_volume", "volumes", "env", "secrets", "idle_policy",
            "status", "status_reason", "current_job", "ssh_command", "jupyter_url", "ssh_config",
            "ssh_host_key_fingerprint", "ssh_known_hosts", "last_activity_at",
            "keep_alive_until", "idle_stop_at", "scheduled_deletion_at", "created_at",
        ]  # fmt: skip
        extra_kwargs = {
            "last_activity_at": {"help_text": "Last SSH connection open through the gateway"},
            "keep_alive_until": {"help_text": "Counted as active until then (keep-alive)"},
            "idle_stop_at": {"help_text": "While idle_warning: when the idle rule stops it"},
        }
        read_only_fields = fields

    def get_ssh_command(self, environment: Environment) -> str:
        return selectors.ssh_command(environment) if jupyter.has_ssh(environment) else ""

    def get_jupyter_url(self, environment: Environment) -> str:
        request = self.context.get("request")
        url = selectors.jupyter_url(environment)
        return request.build_absolute_uri(url) if url and request is not None else url

    def get_ssh_config(self, environment: Environment) -> str:
        return selectors.ssh_config_snippet(environment)

    def get_ssh_host_key_fingerprint(self, environment: Environment) -> str:
        return selectors.host_key_fingerprint(environment)

    def get_ssh_known_hosts(self, environment: Environment) -> str:
        return selectors.known_hosts_line(environment)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_scheduled_deletion_at(self, environment: Environment) -> str | None:
        at = selectors.environment_deletion_at(environment)
        return None if at is None else serializers.DateTimeField().to_representation(at)


class _SpecFields(serializers.Serializer):
    image = StrictCharField(max_length=100, help_text="Catalog image slug")
    cpus = serializers.IntegerField(min_value=1, max_value=1024, required=False, allow_null=True)
    gpu_type = StrictCharField(max_length=40, required=False, allow_null=True)
    gpus_per_node = serializers.IntegerField(min_value=0, max_value=64, required=False)
    interactive = serializers.ChoiceField(choices=Interactive.choices, required=False)
    volumes = serializers.ListField(
        child=VolumeMountSerializer(), required=False, max_length=15,
        help_text='More volumes, e.g. [{"name": "data", "path": "/data", "read_only": true}]',
    )  # fmt: skip
    env = serializers.DictField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False), required=False
    )
    secrets = serializers.ListField(
        child=StrictCharField(max_length=100), required=False, max_length=32,
        help_text="Names of organisation secrets given to its job",
    )  # fmt: skip
    idle_policy = serializers.DictField(
        required=False,
        help_text="idle_minutes (every activity source idle this long: stop; default 60), "
        "warning_minutes (warned this long before; 10), gpu_busy_percent (GPU utilisation "
        "above this is activity; 5), delete_after_stopped_days (null: never; else a stopped "
        "environment and its home volume are deleted after so many days, told a day before)",
    )

    def changes(self) -> dict:
        values = dict(self.validated_data)
        if "volumes" in values:
            values["volumes"] = [dict(mount) for mount in values["volumes"]]
        if "env" in values:
            values["env"] = dict(values["env"])
        return values


class EnvironmentCreateSerializer(_SpecFields):
    name = StrictRegexField(
        NAME_PATTERN, max_length=63, help_text="A DNS label, unique in the organisation"
    )
    region = StrictSlugField(max_length=40, help_text="Region slug")
    home_volume = StrictCharField(
        max_length=63, required=False, allow_null=True,
        help_text="An existing volume to use as home; omitted: <name>-home is created",
    )  # fmt: skip
    home_volume_gib = serializers.IntegerField(
        min_value=1, default=DEFAULT_HOME_GIB, help_text="Size of a home volume made with it"
    )


class EnvironmentUpdateSerializer(_SpecFields):
    image = StrictCharField(max_length=100, required=False)


class KeepAliveSerializer(serializers.Serializer):
    minutes = serializers.IntegerField(
        min_value=0, max_value=KEEP_ALIVE_MAX_MINUTES, default=0,
        help_text="Count as active until this many minutes from now (0: activity now)",
    )  # fmt: skip
