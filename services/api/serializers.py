"""Service API shapes. Input is checked here for types; services.services checks meaning."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.api.fields import StrictBooleanField, StrictCharField, StrictModelSerializer
from jobs.models import Priority
from services import selectors
from services.checks import REVISION_FIELDS
from services.logs import MAX_TAIL
from services.models import (
    AutoscaleMetric,
    Service,
    ServiceAuth,
    ServiceReplica,
    ServiceRevision,
    ServiceScaleEvent,
    ServiceToken,
)
from services.services import ServiceSpec

# The spec's vocabulary; cpu and gpu are refused by the service with the reason.
METRICS = ["rps", "concurrency", "cpu", "gpu"]


class AutoscaleSerializer(serializers.Serializer):
    metric = serializers.ChoiceField(
        choices=METRICS,
        default=AutoscaleMetric.CONCURRENCY,
        help_text="rps (requests per second) or concurrency (requests in flight), per "
        "replica; or, on a cluster, cpu or gpu (utilisation in percent, by its autoscaler)",
    )
    target = serializers.FloatField(
        min_value=0.01, max_value=100_000, default=10, help_text="Per replica"
    )
    scale_down_delay = serializers.IntegerField(
        min_value=0,
        max_value=3600,
        default=300,
        help_text="Seconds the traffic must want fewer replicas before one goes",
    )


class AutoscaleChangeSerializer(serializers.Serializer):
    metric = serializers.ChoiceField(choices=METRICS, required=False)
    target = serializers.FloatField(min_value=0.01, max_value=100_000, required=False)
    scale_down_delay = serializers.IntegerField(min_value=0, max_value=3600, required=False)


class ArgumentField(StrictCharField):
    default_error_messages = {"invalid": "Each argument is a string."}


def _secrets_field():
    return serializers.ListField(
        child=StrictCharField(max_length=100),
        required=False,
        max_length=32,
        help_text="Organisation secrets by name: each replica gets their values as "
        "environment variables when it starts",
    )


class ServiceVolumeSerializer(serializers.Serializer):
    name = StrictCharField(max_length=63, help_text="The volume's name (in the service's region)")
    path = StrictCharField(max_length=400, help_text="Where each replica sees it, e.g. /models")
    read_only = StrictBooleanField(
        required=False, help_text="Always true: replicas share their volumes read-only"
    )


def _volumes_field():
    return ServiceVolumeSerializer(
        many=True,
        required=False,
        help_text="Volumes every replica mounts read-only (model weights, a dataset)",
    )


def _env_field():
    return serializers.DictField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False, max_length=4096),
        required=False,
    )


class ServiceCreateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=63, help_text="A DNS label, unique in the organisation")
    image = StrictCharField(max_length=300)
    command = serializers.ListField(
        child=ArgumentField(trim_whitespace=False, max_length=4096),
        allow_empty=False,
        max_length=256,
    )
    port = serializers.IntegerField(
        min_value=1, max_value=65535, help_text="Where the server listens"
    )
    region = StrictCharField(max_length=40)
    cpus = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    gpu_type = StrictCharField(
        max_length=40,
        required=False,
        allow_null=True,
        default=None,
        help_text="A GPU type's slug for GPU replicas (on the region's cluster); omit for CPU",
    )
    gpus_per_replica = serializers.IntegerField(
        min_value=0,
        max_value=64,
        default=0,
        help_text="GPUs of each replica (1 once gpu_type is set)",
    )
    min_replicas = serializers.IntegerField(min_value=0, max_value=1000, default=2)
    max_replicas = serializers.IntegerField(min_value=1, max_value=1000, default=10)
    readiness_path = StrictCharField(max_length=200, default="/")
    env = _env_field()
    secrets = _secrets_field()
    volumes = _volumes_field()
    auth = serializers.ChoiceField(choices=ServiceAuth.choices, default=ServiceAuth.TOKEN)
    priority = serializers.ChoiceField(
        choices=Priority.choices,
        default=Priority.NORMAL,
        help_text="critical (owners and admins only) keeps serving when a budget is used up",
    )
    autoscale = AutoscaleSerializer(required=False)

    def to_spec(self) -> ServiceSpec:
        data = dict(self.validated_data)
        data["env"] = dict(data.get("env") or {})
        data["secrets"] = list(data.get("secrets") or [])
        data["volumes"] = [dict(mount) for mount in data.get("volumes") or []]
        autoscale = data.pop("autoscale", None) or {}
        data["autoscale_metric"] = autoscale.get("metric", AutoscaleMetric.CONCURRENCY)
        data["autoscale_target"] = autoscale.get("target", 10)
        data["scale_down_delay"] = autoscale.get("scale_down_delay", 300)
        return ServiceSpec(**data)


class ServiceUpdateSerializer(serializers.Serializer):
    image = StrictCharField(max_length=300, required=False)
    command = serializers.ListField(
        child=ArgumentField(trim_whitespace=False, max_length=4096),
        allow_empty=False,
        max_length=256,
        required=False,
    )
    port = serializers.IntegerField(min_value=1, max_value=65535, required=False)
    cpus = serializers.IntegerField(min_value=1, max_value=1024, required=False)
    gpus_per_replica = serializers.IntegerField(min_value=0, max_value=64, required=False)
    min_replicas = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    max_replicas = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    readiness_path = StrictCharField(max_length=200, required=False)
    env = _env_field()
    secrets = _secrets_field()
    volumes = _volumes_field()
    auth = serializers.ChoiceField(choices=ServiceAuth.choices, required=False)
    priority = serializers.ChoiceField(choices=Priority.choices, required=False)
    autoscale = AutoscaleChangeSerializer(required=False)

    # Chosen at creation (they pick the pool and the endpoint): a change is refused with
    # the reason rather than ignored.
    FIXED = ("name", "region", "gpu_type")

    def validate(self, attrs: dict) -> dict:
        fixed = [name for name in self.FIXED if name in (self.initial_data or {})]
        if fixed:
            raise serializers.ValidationError(
                {
                    name: [f"A service's {name} is fixed at creation: create another service."]
                    for name in fixed
                }
            )
        return attrs

    def changes(self) -> dict:
        """The changes as services.service_update takes them."""
        changes = dict(self.validated_data)
        if "env" in changes:
            changes["env"] = dict(changes["env"])
        if "secrets" in changes:
            changes["secrets"] = list(changes["secrets"])
        if "volumes" in changes:
            changes["volumes"] = [dict(mount) for mount in changes["volumes"]]
        autoscale = changes.pop("autoscale", None) or {}
        if "metric" in autoscale:
            changes["autoscale_metric"] = autoscale["metric"]
        if "target" in autoscale:
            changes["autoscale_target"] = autoscale["target"]
        if "scale_down_delay" in autoscale:
            changes["scale_down_delay"] = autoscale["scale_down_delay"]
        return changes


class ServiceScaleSerializer(serializers.Serializer):
    min_replicas = serializers.IntegerField(min_value=0, max_value=1000)
    max_replicas = serializers.IntegerField(min_value=1, max_value=1000)


class ServiceRollbackSerializer(serializers.Serializer):
    revision = serializers.IntegerField(
        min_value=1, help_text="The number of the revision to run again"
    )


class ServiceTokenCreateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=100)


class ServiceSerializer(StrictModelSerializer):
    region: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    revision = serializers.SerializerMethodField()
    ready_replicas = serializers.SerializerMethodField()
    replicas = serializers.SerializerMethodField()
    autoscale = serializers.SerializerMethodField()
    endpoint_url = serializers.SerializerMethodField()
    volumes = ServiceVolumeSerializer(many=True, read_only=True)
    gpu_type: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )

    class Meta:
        model = Service
        fields = [
            "id",
            "name",
            "image",
            "command",
            "env",
            "secrets",
            "volumes",
            "port",
            "cpus",
            "gpu_type",
            "gpus_per_replica",
            "region",
            "min_replicas",
            "max_replicas",
            "readiness_path",
            "auth",
            "priority",
            "status",
            "status_reason",
            "revision",
            "ready_replicas",
            "replicas",
            "desired_replicas",
            "autoscale",
            "endpoint_url",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_revision(self, service: Service) -> int | None:
        return service.current_revision.number if service.current_revision else None

    def get_ready_replicas(self, service: Service) -> int:
        return getattr(service, "ready_replicas", 0)

    def get_replicas(self, service: Service) -> int:
        return getattr(service, "replica_count", 0)

    @extend_schema_field(AutoscaleSerializer)
    def get_autoscale(self, service: Service) -> dict:
        return {
            "metric": service.autoscale_metric,
            "target": service.autoscale_target,
            "scale_down_delay": service.scale_down_delay,
        }

    def get_endpoint_url(self, service: Service) -> str:
        path = selectors.endpoint_path(service)
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path


class ServiceRevisionSerializer(StrictModelSerializer):
    copied_from = serializers.SerializerMethodField()
    volumes = ServiceVolumeSerializer(many=True, read_only=True)

    class Meta:
        model = ServiceRevision
        fields = ["number", *REVISION_FIELDS, "copied_from", "created_at"]
        read_only_fields = fields

    def get_copied_from(self, revision: ServiceRevision) -> int | None:
        return revision.copied_from.number if revision.copied_from else None


class ServiceReplicaSerializer(StrictModelSerializer):
    revision = serializers.IntegerField(source="revision.number", read_only=True)

    class Meta:
        model = ServiceReplica
        fields = ["id", "revision", "state", "reason", "started_at", "ready_at"]
        read_only_fields = fields


class ReplicaLogsQuerySerializer(serializers.Serializer):
    tail = serializers.IntegerField(min_value=1, max_value=MAX_TAIL, default=200, required=False)


class ReplicaLogsSerializer(serializers.Serializer):
    replica = serializers.IntegerField()
    state = StrictCharField()
    lines = serializers.ListField(child=StrictCharField(allow_blank=True))


class ServiceScaleEventSerializer(StrictModelSerializer):
    class Meta:
        model = ServiceScaleEvent
        fields = [
            "at",
            "from_replicas",
            "to_replicas",
            "window",
            "metric",
            "target",
            "stable_value",
            "panic_value",
            "held_requests",
            "cold_start_seconds",
        ]
        read_only_fields = fields


class ServiceTokenSerializer(StrictModelSerializer):
    class Meta:
        model = ServiceToken
        fields = ["id", "name", "prefix", "created_at", "revoked_at"]
        read_only_fields = fields


class ServiceTokenCreatedSerializer(ServiceTokenSerializer):
    token = serializers.SerializerMethodField(help_text="Shown once; only its hash is kept")

    class Meta(ServiceTokenSerializer.Meta):
        fields = [*ServiceTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields

    def get_token(self, token: ServiceToken) -> str:
        return self.context["raw"]
