from __future__ import annotations

import copy
from datetime import UTC, datetime, tzinfo
from decimal import Decimal
from functools import cached_property

from django.db.models import F, QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictEmailField,
    StrictModelSerializer,
    StrictRegexField,
)
from jobs import selectors, services
from jobs.expectations.selectors import EXPECTATION_COLUMNS, job_expectations
from jobs.extensions import job_costs, volume_provider
from jobs.models import Job, JobEvent, JobResume, JobStatus, Priority, TenantSecret
from jobs.selectors import SIMULATED_POOLS
from jobs.services.placement import REQUIREMENT_VALUES
from jobs.services.spec import (
    DEFAULT_MAX_RUNTIME_MINUTES,
    MAX_ACCEPTABLE,
    MAX_COMMAND_ARGS,
    MAX_ENV_TOTAL_BYTES,
    MAX_JOB_SECRETS,
    MAX_VOLUME_MOUNTS,
)
from marketplace.price_book_cache import catalog_names
from marketplace.pricing import MAX_NODES, to_cents
from marketplace.selectors import price_currency


class ArgumentField(StrictCharField):
    """One argv item: a JSON string, never a number turned into one."""

    default_error_messages = {"invalid": "Each argument is a string."}


class VolumeMountSerializer(serializers.Serializer):
    name = StrictCharField(max_length=63, help_text="The volume's name")
    path = StrictCharField(max_length=400, help_text="Absolute mount path, e.g. /data")
    read_only = StrictBooleanField(default=False)


class JobVolumeSerializer(serializers.Serializer):
    name = StrictCharField(help_text="The volume's name")
    path = StrictCharField(help_text="Where the job sees it")
    read_only = StrictBooleanField()
    region = StrictCharField(
        help_text="The volume's region (the job's: a volume is usable only there)"
    )


class RequirementsSerializer(serializers.Serializer):
    """What a job's nodes must have (each optional): only pools that have it take it."""

    interconnect = serializers.ChoiceField(
        choices=REQUIREMENT_VALUES["interconnect"], required=False
    )
    cpu_arch = serializers.ChoiceField(
        choices=REQUIREMENT_VALUES["cpu_arch"], required=False, help_text="kubernetes.io/arch"
    )


class JobCreateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=100)
    project = StrictCharField(max_length=100, required=False, default="", allow_blank=True)
    labels = serializers.DictField(
        child=StrictCharField(max_length=63, allow_blank=True), required=False, default=dict
    )
    image = StrictCharField(max_length=80, help_text="Catalog slug")
    command = serializers.ListField(
        child=ArgumentField(allow_blank=True, trim_whitespace=False),
        allow_empty=False,
        max_length=MAX_COMMAND_ARGS,
    )
    env = serializers.DictField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False),
        required=False,
        default=dict,
    )
    secret_env = serializers.DictField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False),
        required=False,
        default=dict,
    )
    gpu_type = StrictCharField(max_length=40, required=False, allow_null=True, default=None)
    gpus_per_node = serializers.IntegerField(min_value=0, max_value=64, default=0)
    cpus = serializers.IntegerField(
        min_value=1, max_value=1024, required=False, allow_null=True, default=None
    )
    nodes = serializers.IntegerField(min_value=1, max_value=MAX_NODES, default=1)
    region = StrictCharField(max_length=40, required=False, allow_null=True, default=None)
    regions = serializers.ListField(
        child=StrictCharField(max_length=40),
        required=False,
        default=list,
        max_length=MAX_ACCEPTABLE,
        help_text="Several acceptable regions instead of `region` (not both): the launch "
        "takes the lowest hourly price, divided by the pool's locality_weight in the job's "
        "data region",
    )
    gpu_types = serializers.ListField(
        child=StrictCharField(max_length=40),
        required=False,
        default=list,
        max_length=MAX_ACCEPTABLE,
        help_text="Several acceptable GPU types instead of `gpu_type` (not both), chosen "
        "as `regions` are",
    )
    data_region = StrictCharField(
        max_length=40,
        required=False,
        allow_null=True,
        default=None,
        help_text="Where the data it reads lives (e.g. its bucket's region), for a job "
        "without volumes (with volumes, their region is its data region)",
    )
    requirements = RequirementsSerializer(
        required=False,
        default=dict,
        help_text="What its nodes must have; refused (400) when no pool has it",
    )
    spot_ratio = serializers.DecimalField(
        max_digits=4,
        decimal_places=3,
        min_value=Decimal(0),
        max_value=Decimal(1),
        default=Decimal(0),
    )
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.NORMAL)
    max_runtime_minutes = serializers.IntegerField(
        min_value=1, max_value=60 * 24 * 90, default=DEFAULT_MAX_RUNTIME_MINUTES
    )
    checkpoint_path = StrictCharField(max_length=400, required=False, default="", allow_blank=True)
    checkpoint_keep_last = serializers.IntegerField(
        min_value=1,
        max_value=100,
        required=False,
        allow_null=True,
        default=None,
        help_text="complete checkpoints kept in the store (null: the installation's, 3)",
    )
    gpu_memory_gib = serializers.IntegerField(
        min_value=1,
        max_value=4096,
        required=False,
        allow_null=True,
        default=None,
        help_text="GPU memory the job needs per GPU, in GiB: it runs only in pools whose GPUs "
        "fit it with their memory_margin kept free (null: not checked)",
    )
    auto_release = StrictBooleanField(default=True)
    ports = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        default=list,
        help_text='Ports to expose, e.g. [{"name": "jupyter", "port": 8888}]',
    )
    secrets = serializers.ListField(
        child=StrictCharField(max_length=100),
        required=False,
        default=list,
        max_length=MAX_JOB_SECRETS,
        help_text=(
            f"Names of organisation secrets to inject (at most {MAX_JOB_SECRETS}); their "
            f"values count toward the environment's {MAX_ENV_TOTAL_BYTES // 1024} KiB with "
            "env and secret_env"
        ),
    )

    volumes = serializers.ListField(
        child=VolumeMountSerializer(),
        required=False,
        default=list,
        max_length=MAX_VOLUME_MOUNTS,
        help_text="Volumes to mount by name, e.g. "
        '[{"name": "data", "path": "/data", "read_only": false}]',
    )

    def to_spec(self) -> services.JobSpec:
        values = dict(self.validated_data)
        values["volumes"] = [dict(mount) for mount in values.get("volumes", [])]
        values["requirements"] = dict(values.get("requirements") or {})
        return services.JobSpec(**values)


# Relations whose slug a list takes from the catalog's names kept in memory
# (`marketplace.price_book_cache.catalog_names`) rather than from a join.
CATALOG_NAMES = {"gpu_type": "gpu_types", "region": "regions"}


class SlugOfField(StrictCharField):
    """The slug of a related catalog row (`source` names the relation): the list's
    annotation `<relation>_slug` when the job was read with it (`RELATED_SLUGS`), a GPU
    type's or region's from the catalog's names when the row wasn't read with the job
    (the parent's `_batch()` holds them), else the related row's."""

    def __init__(self, **kwargs):
        super().__init__(read_only=True, **kwargs)

    def get_attribute(self, instance):
        relation = self.source
        if hasattr(instance, f"{relation}_slug"):
            return getattr(instance, f"{relation}_slug")
        if relation in CATALOG_NAMES and not instance._meta.get_field(relation).is_cached(instance):
            pk = getattr(instance, f"{relation}_id")
            if pk is None:
                return None
            names = getattr(self.parent._batch()["names"], CATALOG_NAMES[relation])
            return names[pk][0]
        related = getattr(instance, relation)
        return related.slug if related is not None else None


# What a job list reads of its related rows with the job: the image's slug (the GPU
# type's and the region's come from the catalog's names).
RELATED_SLUGS = {"image_slug": F("image__slug")}


# How DRF's fields write a value that is written as the model stores it (a string, a
# number, a boolean, JSON, a choice's value); their strict kinds write it the same way.
WRITES_AS_STORED = {
    field_class.to_representation
    for field_class in (
        serializers.CharField,
        serializers.IntegerField,
        serializers.BooleanField,
        serializers.JSONField,
        serializers.ChoiceField,
    )
}


def _as_stored(field: serializers.Field) -> str | None:
    """The attribute to read for `field` when it writes it as stored, else None."""
    kind = type(field)
    plain = kind.to_representation in WRITES_AS_STORED
    reads_its_source = kind.get_attribute is serializers.Field.get_attribute
    simple = field.source != "*" and "." not in field.source
    return field.source if plain and reads_its_source and simple else None


class RuntimePredictionSerializer(serializers.Serializer):
    """A job's predicted running time (jobs.expectations.runtime.RuntimePrediction)."""

    median_seconds = serializers.IntegerField()
    p90_seconds = serializers.IntegerField()
    samples = serializers.IntegerField(help_text="Similar past runs it rests on (0: none)")
    basis = serializers.ChoiceField(
        choices=["project", "launch_template", "image", "gpu_type", "max_runtime"],
        help_text="Which similar runs: the first kind with at least 3, else max_runtime",
    )


class JobSerializer(StrictModelSerializer):
    """The API's one writing of a job, a list's rows and a single job alike. Each job's
    cost and queue position come from one batch for all the jobs it writes (`_batch`)."""

    image = SlugOfField()
    gpu_type = SlugOfField(allow_null=True)
    region = SlugOfField()
    secret_env = serializers.SerializerMethodField()
    cost_to_date = serializers.SerializerMethodField()
    price_per_hour = serializers.SerializerMethodField(
        help_text="Its run rate: the price per hour of its spot and on-demand nodes, to the "
        "cent as an estimate's `hourly`; null without a price"
    )
    simulated = serializers.SerializerMethodField(
        help_text="Runs on the sandbox cluster's simulated nodes: its command is not executed"
    )
    currency = serializers.SerializerMethodField(
        help_text="The currency of `price_per_hour` and `cost_to_date`"
    )
    queue_position = serializers.SerializerMethodField()
    expected_start = serializers.SerializerMethodField(
        help_text="Queued: when it is expected to start (null: not foreseeable)"
    )
    expected_end = serializers.SerializerMethodField(
        help_text="Queued or running: when it is expected to end"
    )
    runtime_prediction = serializers.SerializerMethodField(
        help_text="Predicted running time: median_seconds, p90_seconds, samples (similar "
        "past runs) and basis (project, launch_template, image, gpu_type or max_runtime)"
    )
    volumes = serializers.SerializerMethodField(help_text="The volumes it mounts, in order")
    _model_fields: dict[str, serializers.Field] | None = None

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "project",
            "labels",
            "image",
            "image_reference",
            "command",
            "env",
            "secret_env",
            "gpu_type",
            "gpus_per_node",
            "cpus",
            "nodes",
            "region",
            "spot_ratio",
            "priority",
            "max_runtime_minutes",
            "checkpoint_path",
            "checkpoint_keep_last",
            "gpu_memory_gib",
            "requirements",
            "last_checkpoint_step",
            "last_checkpoint_at",
            "auto_release",
            "backend",
            "spot_nodes",
            "on_demand_nodes",
            "simulated",
            "price_per_hour",
            "status",
            "status_reason",
            "queue_position",
            "expected_start",
            "expected_end",
            "runtime_prediction",
            "volumes",
            "attempt",
            "exit_code",
            "cost_to_date",
            "currency",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_fields(self):
        # ModelSerializer works each field out from the model for every instance (most
        # of a millisecond an answer); they are the same each time: worked out once per
        # process, then copied for each instance, as DRF copies declared fields.
        if JobSerializer._model_fields is None:
            JobSerializer._model_fields = super().get_fields()
        return copy.deepcopy(JobSerializer._model_fields)

    def to_representation(self, instance):
        # DRF's loop, but a field that writes a value as it is stored is read straight
        # off the job: going through each field object was most of a list's time.
        document = {}
        for name, attname, field in self._writing:
            if attname is not None:
                document[name] = getattr(instance, attname)
            elif type(field) is serializers.DateTimeField:  # (ISO 8601, the current zone)
                document[name] = self._timestamp(getattr(instance, field.source))
            else:
                attribute = field.get_attribute(instance)
                document[name] = None if attribute is None else field.to_representation(attribute)
        return document

    @cached_property
    def _writing(self) -> list[tuple[str, str | None, serializers.Field]]:
        """Each readable field, with the attribute to read when it writes it as stored."""
        return [(field.field_name, _as_stored(field), field) for field in self._readable_fields]

    @cached_property
    def _zone(self) -> tzinfo:
        zone = timezone.get_current_timezone()
        return UTC if getattr(zone, "key", None) == "UTC" else zone

    def _timestamp(self, value: datetime | None) -> str | None:
        """A time as DRF's DateTimeField writes it (ISO 8601 in the current time zone,
        UTC as "Z"), without its per-call look-ups of the zone and the format."""
        if value is None:
            return None
        text = value.astimezone(self._zone).isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text

    def get_secret_env(self, job) -> dict[str, str]:
        return {name: "••••••" for name in job.secret_env_names}

    def _batch(self) -> dict:
        """Costs, queue positions and expectations of every job being serialized,
        computed once."""
        if "_job_batch" not in self.context:
            instances = self.parent.instance if self.parent is not None else self.instance
            jobs = [instances] if isinstance(instances, Job) else list(instances)
            rates = job_costs().run_rates(jobs)
            self.context["_job_batch"] = {
                "costs": job_costs().costs_to_date(jobs, rates=rates),
                "rates": rates,
                "positions": selectors.queue_positions(jobs),
                "expectations": job_expectations(jobs),
                "currency": price_currency(),
                "volumes": volume_provider().mounts_for_jobs(jobs),
                "names": catalog_names(
                    gpu_type_ids={j.gpu_type_id for j in jobs},
                    region_ids={j.region_id for j in jobs},
                ),
            }
        return self.context["_job_batch"]

    def get_cost_to_date(self, job) -> str:
        return str(self._batch()["costs"][job.pk])

    def get_price_per_hour(self, job) -> str | None:
        rate = self._batch()["rates"][job.pk]
        return None if rate is None else str(to_cents(rate))

    def get_currency(self, job) -> str:
        return self._batch()["currency"]

    def get_simulated(self, job) -> bool:
        return job.simulated

    def get_queue_position(self, job) -> int | None:
        return self._batch()["positions"].get(job.pk) if job.status == "queued" else None

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_expected_start(self, job) -> str | None:
        return self._timestamp(self._batch()["expectations"][job.pk].expected_start)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_expected_end(self, job) -> str | None:
        return self._timestamp(self._batch()["expectations"][job.pk].expected_end)

    @extend_schema_field(JobVolumeSerializer(many=True))
    def get_volumes(self, job) -> list[dict]:
        region = self.fields["region"].get_attribute(job)
        return [
            {"name": m.name, "path": m.path, "read_only": m.read_only, "region": region}
            for m in self._batch()["volumes"].get(job.pk, [])
        ]

    @extend_schema_field(RuntimePredictionSerializer(allow_null=True))
    def get_runtime_prediction(self, job) -> dict | None:
        prediction = self._batch()["expectations"][job.pk].prediction
        return None if prediction is None else prediction.as_dict()


# The columns a row shows or prices from (and what a queue position reads): a list
# page loads nothing else.
ROW_COLUMNS = (
    "id", "tenant_id", "name", "project", "labels", "image_reference", "command", "env",
    "secret_env_names", "gpu_type_id", "gpus_per_node", "cpus", "nodes", "region_id",
    "spot_ratio", "priority", "max_runtime_minutes", "checkpoint_path", "checkpoint_keep_last",
    "gpu_memory_gib", "requirements", "last_checkpoint_step", "last_checkpoint_at",
    "auto_release", "backend", "spot_nodes", "on_demand_nodes", "pool_id", "spot_pool_id", "status",
    "status_reason", "attempt", "exit_code", "created_at", "started_at", "finished_at",
)  # fmt: skip


def listed_jobs(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """`jobs` as a list page reads them: the columns a row shows, prices from or expects
    from, the slugs of their catalog rows and their costs' inputs (`with_cost_inputs`)."""
    columns = dict.fromkeys((*ROW_COLUMNS, *EXPECTATION_COLUMNS))
    return job_costs().with_cost_inputs(
        jobs.annotate(**RELATED_SLUGS, **SIMULATED_POOLS).only(*columns)
    )


class JobQuerySerializer(serializers.Serializer):
    """The job list's filter (a query parameter)."""

    status = serializers.ChoiceField(choices=JobStatus.choices, required=False)


class LogQuerySerializer(serializers.Serializer):
    """Which log lines to read (query parameters); out-of-range numbers are clamped."""

    since_line = serializers.IntegerField(default=0, help_text="First line number (from 0)")
    limit = serializers.IntegerField(default=1000, help_text="Lines to return, 1 to 5000")


class LogLineSerializer(serializers.Serializer):
    """One line of a job's log (`jobs.realtime.LogLinePayload`), secret values masked."""

    line_no = serializers.IntegerField(help_text="Line number, from 1, across the job's ranks")
    rank = serializers.IntegerField(help_text="The node (rank) that printed it")
    text = StrictCharField(allow_blank=True, help_text="The line, without its newline")
    ts = serializers.DateTimeField(help_text="When the server read the line")


class LogPageSerializer(serializers.Serializer):
    """A page of a job's log (`jobs.logs.reading.read_lines`)."""

    lines = LogLineSerializer(many=True)
    next_line = serializers.IntegerField(
        help_text="Pass as since_line to read on; the same since_line when no line followed"
    )


class JobEventSerializer(StrictModelSerializer):
    actor = StrictCharField(
        read_only=True,
        help_text='Who acted: the person\'s e-mail, or "system", "backend", "budget", '
        '"alerts", "suspension"',
    )

    class Meta:
        model = JobEvent
        fields = ["at", "from_status", "to_status", "actor", "actor_kind", "reason", "attempt"]


class LogLineSerializer(serializers.Serializer):
    line_no = serializers.IntegerField()
    rank = serializers.IntegerField()
    text = StrictCharField()


class TenantSecretSerializer(StrictModelSerializer):
    """A secret as listed: where it may be used, never its value."""

    created_by = StrictEmailField(
        source="created_by.email", allow_null=True, default=None, read_only=True
    )

    class Meta:
        model = TenantSecret
        fields = ["id", "name", "projects", "members_may_use", "created_by", "updated_at"]
        read_only_fields = fields


class TenantSecretSetSerializer(serializers.Serializer):
    """Create or replace a secret (the value is write-only: it is never read back)."""

    # An environment variable name (and not GPUGEEK_…, which the service refuses).
    name = StrictRegexField(r"^[A-Za-z_][A-Za-z0-9_]*\Z", max_length=100)
    value = StrictCharField(write_only=True, trim_whitespace=False, max_length=32 * 1024)
    projects = serializers.ListField(
        child=StrictCharField(max_length=100),
        required=False,
        default=list,
        max_length=50,
        help_text="Projects whose jobs may use it; empty: any project",
    )
    members_may_use = StrictBooleanField(
        default=False, help_text="Members' jobs may use it too (else owners' and admins' only)"
    )


class JobCloneSerializer(serializers.Serializer):
    from_checkpoint = StrictBooleanField(
        required=False,
        default=False,
        help_text="the clone's first start continues from this job's latest checkpoint",
    )


class CheckpointFileSerializer(serializers.Serializer):
    path = StrictCharField()
    size = serializers.IntegerField(help_text="bytes")


class CheckpointSerializer(serializers.Serializer):
    """One complete checkpoint (its manifest written last, every listed file present)."""

    step = serializers.IntegerField()
    time = serializers.DateTimeField()
    size_bytes = serializers.IntegerField()
    files = CheckpointFileSerializer(many=True)
    metrics = serializers.DictField()
    manifest_url = serializers.SerializerMethodField()

    def get_manifest_url(self, checkpoint) -> str:
        return selectors.checkpoint_manifest_url(job=self.context["job"], checkpoint=checkpoint)


class JobResumeSerializer(StrictModelSerializer):
    """Where one start after the first continued from; step null: from the beginning."""

    class Meta:
        model = JobResume
        fields = ["attempt", "start", "at", "step", "checkpoint_at", "lost_seconds"]


class JobCheckpointsSerializer(serializers.Serializer):
    checkpoints = CheckpointSerializer(many=True)
    resumes = JobResumeSerializer(many=True)
    unavailable = StrictCharField(help_text="why the store couldn't be read; empty when it was")
