from __future__ import annotations

from datetime import UTC
from decimal import Decimal

from django.db.models import F
from django.utils import timezone
from rest_framework import serializers

from console.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictEmailField,
    StrictModelSerializer,
    StrictRegexField,
)
from jobs import selectors, services
from jobs.extensions import job_costs
from jobs.models import Job, JobEvent, JobStatus, Priority, TenantSecret
from jobs.services.spec import MAX_COMMAND_ARGS, MAX_ENV_TOTAL_BYTES, MAX_JOB_SECRETS


class ArgumentField(StrictCharField):
    """One argv item: a JSON string, never a number turned into one."""

    default_error_messages = {"invalid": "Each argument is a string."}


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
    nodes = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    region = StrictCharField(max_length=40, required=False, allow_null=True, default=None)
    spot_ratio = serializers.DecimalField(
        max_digits=4,
        decimal_places=3,
        min_value=Decimal(0),
        max_value=Decimal(1),
        default=Decimal(0),
    )
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.NORMAL)
    max_runtime_minutes = serializers.IntegerField(
        min_value=1, max_value=60 * 24 * 90, default=24 * 60
    )
    checkpoint_path = StrictCharField(max_length=400, required=False, default="", allow_blank=True)
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

    def to_spec(self) -> services.JobSpec:
        return services.JobSpec(**self.validated_data)


class JobSerializer(StrictModelSerializer):
    image = StrictCharField(source="image.slug")
    gpu_type = StrictCharField(source="gpu_type.slug", allow_null=True, default=None)
    region = StrictCharField(source="region.slug")
    secret_env = serializers.SerializerMethodField()
    cost_to_date = serializers.SerializerMethodField()
    queue_position = serializers.SerializerMethodField()

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
            "auto_release",
            "backend",
            "spot_nodes",
            "on_demand_nodes",
            "status",
            "status_reason",
            "queue_position",
            "attempt",
            "exit_code",
            "cost_to_date",
            "created_at",
            "started_at",
            "finished_at",
        ]

    def get_secret_env(self, job) -> dict[str, str]:
        return {name: "••••••" for name in job.secret_env_names}

    def _batch(self) -> dict:
        """Costs and queue positions of every job being serialized, computed once."""
        if "_job_batch" not in self.context:
            instances = self.parent.instance if self.parent is not None else self.instance
            jobs = [instances] if isinstance(instances, Job) else list(instances)
            self.context["_job_batch"] = {
                "costs": job_costs().costs_to_date(jobs),
                "positions": selectors.queue_positions(jobs),
            }
        return self.context["_job_batch"]

    def get_cost_to_date(self, job) -> str:
        cost = self._batch()["costs"].get(job.pk)
        if cost is None:
            cost = job_costs().costs_to_date([job])[job.pk]
        return str(cost)

    def get_queue_position(self, job) -> int | None:
        return self._batch()["positions"].get(job.pk) if job.status == "queued" else None


def _timestamp(value, zone) -> str | None:
    """A datetime as DRF writes it (ISO 8601 in the current time zone, UTC as "Z")."""
    if value is None:
        return None
    text = value.astimezone(zone).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


SPOT_RATIO_QUANTUM = Decimal("0.001")
# Annotations a job list reads instead of joining whole objects (see JobViewSet.list).
RELATED_SLUGS = {
    "image_slug": F("image__slug"),
    "gpu_type_slug": F("gpu_type__slug"),
    "region_slug": F("region__slug"),
}


# The columns a row shows or prices from (and what a queue position reads): a list
# page loads nothing else.
ROW_COLUMNS = (
    "id", "tenant_id", "name", "project", "labels", "image_reference", "command", "env",
    "secret_env_names", "gpu_type_id", "gpus_per_node", "cpus", "nodes", "region_id",
    "spot_ratio", "priority", "max_runtime_minutes", "checkpoint_path", "auto_release",
    "backend", "spot_nodes", "on_demand_nodes", "pool_id", "spot_pool_id", "status",
    "status_reason", "attempt", "exit_code", "created_at", "started_at", "finished_at",
)  # fmt: skip
# What a list page reads per row: the columns and the related slugs (`RELATED_SLUGS`);
# the cost provider adds its inputs (`JobCostProvider.with_cost_inputs`).
ROW_VALUES = (*ROW_COLUMNS, *RELATED_SLUGS)


def _related_slug(job: Job, relation: str) -> str | None:
    if hasattr(job, f"{relation}_slug"):
        return getattr(job, f"{relation}_slug")
    related = getattr(job, relation)
    return related.slug if related is not None else None


def _row_of(job: Job) -> dict:
    """A job as a list page reads it (`ROW_VALUES`), from an instance."""
    row = {column: getattr(job, column) for column in ROW_COLUMNS}
    for relation in ("image", "gpu_type", "region"):
        row[f"{relation}_slug"] = _related_slug(job, relation)
    return row


def _documents(rows: list[dict], costs: dict, positions: dict) -> list[dict]:
    zone = timezone.get_current_timezone()
    if getattr(zone, "key", None) == "UTC":  # the database's own zone: nothing to convert
        zone = UTC
    return [
        {
            "id": row["id"],
            "name": row["name"],
            "project": row["project"],
            "labels": row["labels"],
            "image": row["image_slug"],
            "image_reference": row["image_reference"],
            "command": row["command"],
            "env": row["env"],
            "secret_env": {name: "••••••" for name in row["secret_env_names"]},
            "gpu_type": row["gpu_type_slug"],
            "gpus_per_node": row["gpus_per_node"],
            "cpus": row["cpus"],
            "nodes": row["nodes"],
            "region": row["region_slug"],
            "spot_ratio": str(Decimal(row["spot_ratio"]).quantize(SPOT_RATIO_QUANTUM)),
            "priority": row["priority"],
            "max_runtime_minutes": row["max_runtime_minutes"],
            "checkpoint_path": row["checkpoint_path"],
            "auto_release": row["auto_release"],
            "backend": row["backend"],
            "spot_nodes": row["spot_nodes"],
            "on_demand_nodes": row["on_demand_nodes"],
            "status": row["status"],
            "status_reason": row["status_reason"],
            "queue_position": positions.get(row["id"]) if row["status"] == "queued" else None,
            "attempt": row["attempt"],
            "exit_code": row["exit_code"],
            "cost_to_date": str(costs[row["id"]]),
            "created_at": _timestamp(row["created_at"], zone),
            "started_at": _timestamp(row["started_at"], zone),
            "finished_at": _timestamp(row["finished_at"], zone),
        }
        for row in rows
    ]


def job_rows(jobs: list[Job]) -> list[dict]:
    """The jobs as `JobSerializer` writes them, without its per-field machinery. The
    serializer stays the schema; a test checks both write the same document."""
    costs = job_costs().costs_to_date(jobs)
    positions = selectors.queue_positions(jobs)
    return _documents([_row_of(job) for job in jobs], costs, positions)


def job_rows_from_values(rows: list[dict]) -> list[dict]:
    """`job_rows` for rows read as `ROW_VALUES` of a queryset `with_cost_inputs` (the
    list API's hot path: building a model instance per row cost a third of a page;
    only queued rows become instances, for their queue positions)."""
    costs = job_costs().row_costs(rows)
    queued = [selectors.job_from_row(row) for row in rows if row["status"] == JobStatus.QUEUED]
    return _documents(rows, costs, selectors.queue_positions(queued))


def job_row(job: Job) -> dict:
    return job_rows([job])[0]


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
