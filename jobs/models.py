"""Jobs: what a tenant asked to run (the spec), where it stands (status), and its history."""

from __future__ import annotations

import shlex
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from console.tenancy import TenantOwnedModel, TenantScopedQuerySet
from jobs.actors import NON_USER_ACTORS, ActorKind


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    DISPATCHING = "dispatching", "Dispatching"
    PROVISIONING = "provisioning", "Provisioning"
    RUNNING = "running", "Running"
    PAUSING = "pausing", "Pausing"
    PAUSED = "paused", "Paused"
    RESUMING = "resuming", "Resuming"
    CANCELLING = "cancelling", "Cancelling"
    PREEMPTED = "preempted", "Preempted"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
# Told to stop, the work may still run (a process ignoring SIGTERM for its grace period,
# pods terminating) until the backend reports it ended: it holds its compute and its
# bill until then.
STOPPING = frozenset({JobStatus.PAUSING, JobStatus.CANCELLING})
# Statuses that are billed: from `running` until compute is released. Only `running`
# opens a bill; the stopping statuses keep one open (a job stopped before it ran, e.g.
# while provisioning, pays nothing). Metering, cost to date and run rates read these.
BILL_OPENS = JobStatus.RUNNING
BILLED_STATUSES = frozenset({BILL_OPENS, *STOPPING})
# Statuses in which the backend may be running the job's work: the watcher observes
# them, and a cancel from one of them waits in `cancelling` for the work to end (from the
# others, nothing runs: it is `cancelled` at once).
ON_BACKEND = frozenset({JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.RESUMING, *STOPPING})
# Statuses that hold compute (count against capacity and quota).
HOLDING_COMPUTE = frozenset({JobStatus.DISPATCHING, *ON_BACKEND})
# Statuses a pause (by a user, a budget, a suspension, an alert rule) starts from.
PAUSABLE = frozenset({JobStatus.RUNNING, JobStatus.PROVISIONING})


class WaitKind(models.TextChoices):
    """What a job not yet running waits for. Admission decides on this field; the
    human-readable `status_reason` beside it is built from it, never parsed."""

    NONE = "", "Not waiting"
    ADMISSION = "admission", "Waiting for admission"
    CAPACITY = "capacity", "Waiting for free GPUs or vCPUs"
    POOL_QUEUE = "pool_queue", "Behind earlier jobs for the same pool"
    QUOTA = "quota", "Held by the organisation's quota"
    QUOTA_QUEUE = "quota_queue", "Behind the organisation's earlier jobs (quota)"
    FAIR_SHARE = "fair_share", "Other organisations' turn first (fair share)"
    TOPOLOGY = "topology", "Waiting for enough free nodes in one topology block"
    BACKEND = "backend", "Waiting on the backend (scheduling, Kueue admission)"
    RETRY = "retry", "Retrying a backend call"
    SUSPENDED = "suspended", "The organisation is suspended"


# Waits caused by the tenant's own quota: such a job holds back only its own tenant's
# later jobs for its pools, never another tenant's.
QUOTA_WAITS = frozenset({WaitKind.QUOTA, WaitKind.QUOTA_QUEUE})


class Priority(models.TextChoices):
    CRITICAL = "critical", "Critical"
    NORMAL = "normal", "Normal"
    LOW = "low", "Low"


PRIORITY_RANK: dict[str, int] = {Priority.CRITICAL: 0, Priority.NORMAL: 1, Priority.LOW: 2}
# What losing one GPU of a job of this priority costs when admission picks preemption
# victims (victims minimise weight × GPUs lost).
PRIORITY_WEIGHT: dict[str, int] = {Priority.LOW: 1, Priority.NORMAL: 2, Priority.CRITICAL: 4}


class JobQuerySet(TenantScopedQuerySet):
    def active(self):
        return self.exclude(status__in=FINISHED)

    def holding_compute(self):
        return self.filter(status__in=HOLDING_COMPUTE)

    def with_backend_relations(self):
        """With what a backend reads to start an attempt (pools, region, GPU type,
        image), in the one query: lazily they would be four more per dispatch."""
        return self.select_related("pool", "spot_pool", "region", "gpu_type", "image")


class Job(TenantOwnedModel):
    tenant = models.ForeignKey("console.Tenant", on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    name = models.CharField(max_length=100)
    project = models.CharField(max_length=100, blank=True, db_index=True)
    labels = models.JSONField(default=dict, blank=True)

    # --- spec (immutable after launch; clone to change) ---
    image = models.ForeignKey("marketplace.Image", on_delete=models.PROTECT, related_name="+")
    image_reference = models.CharField(max_length=400)
    command = models.JSONField(default=list)
    env = models.JSONField(default=dict, blank=True)
    # Values encrypted with console.crypto; names kept in clear for display.
    secret_env_encrypted = models.TextField(blank=True)
    secret_env_names = models.JSONField(default=list, blank=True)
    gpu_type = models.ForeignKey(
        "marketplace.GpuType", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    gpus_per_node = models.PositiveIntegerField(default=0)
    cpus = models.PositiveIntegerField(default=1)
    nodes = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    region = models.ForeignKey("marketplace.Region", on_delete=models.PROTECT, related_name="+")
    spot_ratio = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        default=Decimal(0),
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1))],
    )
    priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.NORMAL)
    max_runtime_minutes = models.PositiveIntegerField(default=24 * 60)
    checkpoint_path = models.CharField(max_length=400, blank=True)
    # The checkpoint the current start continues from: its manifest's key under the job's
    # own store prefix (`<step>/gpugeek-checkpoint.json`), handed over as GPUGEEK_RESUME_FROM.
    resume_from = models.CharField(max_length=200, blank=True, default="")
    # "Clone from checkpoint": the job whose latest checkpoint this one's first start
    # continues from (copied into this job's own prefix at its dispatch).
    checkpoint_source = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Complete checkpoints kept in the store (older ones are pruned); None: the
    # installation's CHECKPOINT_KEEP_LAST.
    checkpoint_keep_last = models.PositiveSmallIntegerField(null=True, blank=True)
    # The GPU memory the job says it needs per GPU (GiB); its pools must fit it with their
    # memory_margin (NodePool.gpu_memory_refusal). None: not declared, not checked.
    gpu_memory_gib = models.PositiveIntegerField(null=True, blank=True)
    # The newest complete checkpoint the console has seen (from the job's `checkpoint`
    # event or the periodic scan), read from the store, never from what the job says.
    last_checkpoint_step = models.PositiveBigIntegerField(null=True, blank=True)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    # The job's `checkpoint` events are rate-limited (each lists the store): when its
    # next event is due if it keeps to the sustained rate (jobs.checkpoints.events).
    checkpoint_event_due_at = models.DateTimeField(null=True, blank=True)
    auto_release = models.BooleanField(default=True)
    ports = models.JSONField(default=list, blank=True)
    # The template it was launched from, if any: its past runs predict this one's runtime.
    launch_template = models.ForeignKey(
        "jobs.LaunchTemplate", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    # --- placement (decided at launch from the spot ratio) ---
    backend = models.CharField(max_length=16)
    spot_nodes = models.PositiveIntegerField(default=0)
    on_demand_nodes = models.PositiveIntegerField(default=0)
    pool = models.ForeignKey(
        "marketplace.NodePool", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    spot_pool = models.ForeignKey(
        "marketplace.NodePool", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # What its nodes must have (interconnect, cpu_arch): only pools that have it were
    # candidates at launch (jobs.services.placement).
    requirements = models.JSONField(default=dict, blank=True)
    # A gang over TOPOLOGY_BLOCK_NODES nodes runs inside one topology block of its pool:
    # the block admission chose (the value of the pool's topology label), "" otherwise.
    topology_block = models.CharField(max_length=63, blank=True, default="")
    # Local backend: GPU indices handed to this job through CUDA_VISIBLE_DEVICES.
    assigned_devices = models.JSONField(default=list, blank=True)

    # --- state ---
    status = models.CharField(
        max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED, db_index=True
    )
    status_reason = models.CharField(max_length=500, blank=True)
    wait_kind = models.CharField(
        max_length=16, choices=WaitKind.choices, default=WaitKind.NONE, blank=True, db_index=True
    )
    status_changed_at = models.DateTimeField(default=timezone.now)
    attempt = models.PositiveIntegerField(default=1)
    exit_code = models.IntegerField(null=True, blank=True)
    # Set when the budget paused it, so raising the budget resumes only those.
    paused_by_budget = models.BooleanField(default=False)
    # Dispatches of this attempt that failed with an unexpected error (not a retryable
    # outage); at DISPATCH_MAX_ATTEMPTS the job fails instead of holding capacity.
    dispatch_failures = models.PositiveIntegerField(default=0)
    # The job row is the dispatch queue: a sweep claims `dispatching` rows it will create
    # (its id, until the claim times out) and a failed create waits until dispatch_after.
    dispatch_claimed_by = models.CharField(max_length=64, blank=True, default="")
    dispatch_claimed_until = models.DateTimeField(null=True, blank=True)
    dispatch_after = models.DateTimeField(null=True, blank=True)
    # Running time of earlier running spans, and when the current one began: max runtime
    # counts running time only (pauses and preemptions don't consume it).
    run_seconds = models.FloatField(default=0)
    running_since = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="job_idempotency_key_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "status"]),
            # The tenant's job list, newest first: a page is an index range, not a sort.
            models.Index(fields=["tenant", "-created_at", "-id"], name="job_tenant_newest"),
        ]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def command_display(self) -> str:
        """The argv as a shell would quote it (for reading and copying, never executed)."""
        return shlex.join(self.command)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    @property
    def can_pause(self) -> bool:
        return self.status in PAUSABLE

    @property
    def is_critical(self) -> bool:
        return self.priority == Priority.CRITICAL

    @property
    def simulated(self) -> bool:
        """Whether it runs on the sandbox cluster's simulated nodes (its command is never
        run there). Read from a list's `SIMULATED_POOLS` annotations when present, else
        from its pools (select them with the job)."""
        if hasattr(self, "pool_simulated"):
            return bool(self.pool_simulated or self.spot_pool_simulated)
        return any(pool.simulated for pool in (self.pool, self.spot_pool) if pool is not None)


class JobEvent(models.Model):
    """One status change (or notable backend event) in a job's timeline."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16, blank=True)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    # The person, when actor_kind is user; None once their account is deleted.
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.CharField(max_length=1000, blank=True)
    attempt = models.PositiveIntegerField(default=1)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "job__tenant"

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_status} → {self.to_status}"

    @property
    def actor(self) -> str:
        """Who acted, as one word the API has always given: the person's e-mail, or
        "system", "backend", "budget", "alerts", "suspension". Reads `actor_user`:
        select it with the events."""
        if self.actor_kind != ActorKind.USER:
            return NON_USER_ACTORS[ActorKind(self.actor_kind)].label
        return self.actor_user.email if self.actor_user else "deleted user"


class JobResume(models.Model):
    """Where one start of a job after its first (a requeued attempt, a resume after a
    pause, a clone from a checkpoint) continued from, and the work lost: the time between
    its last complete checkpoint and the interruption. One per attempt and start."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="resumes")
    attempt = models.PositiveIntegerField()
    # 0: the attempt's first start; n: its n-th resume after a pause.
    start = models.PositiveIntegerField(default=0)
    at = models.DateTimeField(default=timezone.now)
    # Empty when no complete checkpoint existed: the start began from scratch.
    manifest_key = models.CharField(max_length=200, blank=True)
    step = models.PositiveBigIntegerField(null=True, blank=True)
    checkpoint_at = models.DateTimeField(null=True, blank=True)
    lost_seconds = models.FloatField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "job__tenant"

    class Meta:
        ordering = ["attempt", "start"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "start"], name="job_resume_once_per_start"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}: attempt {self.attempt} from step {self.step}"

    @property
    def lost_minutes(self) -> float | None:
        return None if self.lost_seconds is None else self.lost_seconds / 60


class TenantSecret(TenantOwnedModel):
    """A named secret (HF_TOKEN, WANDB_API_KEY…) stored encrypted once and referenced by
    name from jobs; its value is never shown again."""

    tenant = models.ForeignKey("console.Tenant", on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=100)
    value_encrypted = models.TextField()
    # Where it may be used: jobs of these projects only (empty: any project), and by
    # whom: members' jobs too, or only admins' and owners' (the default).
    projects = models.JSONField(default=list, blank=True)
    members_may_use = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="tenant_secret_unique_name")
        ]

    def __str__(self) -> str:
        return self.name


class LaunchTemplate(TenantOwnedModel):
    """A saved job spec to launch again."""

    tenant = models.ForeignKey(
        "console.Tenant", on_delete=models.CASCADE, related_name="launch_templates"
    )
    name = models.CharField(max_length=100)
    spec = models.JSONField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="launch_template_unique_name")
        ]

    def __str__(self) -> str:
        return self.name


# --- live monitoring: logs archive, GPU metrics, alerts (jobs/logs, metrics, alerts) ---


class JobLogArchive(models.Model):
    """Where a finished job's full log was archived (gzip), so it stays readable after its
    pods or run directory are gone. One per job; written by `jobs.logs.archive.job_log_archive`."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="log_archive")
    path = models.CharField(max_length=500)
    lines = models.PositiveIntegerField(default=0)
    size_bytes = models.PositiveBigIntegerField(default=0)
    archived_at = models.DateTimeField(default=timezone.now)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "job__tenant"

    def __str__(self) -> str:
        return f"log of job {self.job_id}"


class MetricResolution(models.IntegerChoices):
    RAW = 0, "raw"
    MINUTE = 60, "1-minute mean"


class JobMetricSample(models.Model):
    """One GPU's readings at one time (raw), or their 1-minute mean once older than the
    raw retention (`metrics.metrics_downsample`). Floats: measurements, not money."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_samples")
    at = models.DateTimeField()
    resolution = models.PositiveSmallIntegerField(
        choices=MetricResolution.choices, default=MetricResolution.RAW
    )
    node = models.CharField(max_length=253)  # "rank 0", or the host for local jobs
    gpu = models.PositiveSmallIntegerField()  # index on its node
    utilization = models.FloatField(null=True, blank=True)  # %
    memory_used_mib = models.FloatField(null=True, blank=True)
    memory_total_mib = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "job__tenant"

    class Meta:
        ordering = ["at", "node", "gpu"]
        indexes = [
            models.Index(fields=["job", "at"]),
            models.Index(fields=["resolution", "at"]),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.node}/gpu{self.gpu} @ {self.at:%H:%M:%S}"


class AlertKind(models.TextChoices):
    UTILIZATION_UNSTABLE = "utilization_unstable", "GPU utilisation unstable"
    MEMORY_LEAK = "memory_leak", "GPU memory leak"
    LOSS_EXPLOSION = "loss_explosion", "Loss explosion"
    GPU_IDLE = "gpu_idle", "GPU idle"
    HARDWARE_FAULT = "hardware_fault", "Hardware fault (XID error)"
    STUCK_RANK = "stuck_rank", "Rank stuck while the others run"


class JobAlert(models.Model):
    """An alert raised by the self-healing rules (jobs.alerts); also noted in the job's
    timeline. The same kind is not raised again for a job within the cool-down."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    severity = models.CharField(max_length=16, default="warning")  # warning | critical
    message = models.CharField(max_length=500)
    at = models.DateTimeField(default=timezone.now)
    attempt = models.PositiveIntegerField(default=1)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "job__tenant"

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["job", "kind", "at"])]

    def __str__(self) -> str:
        return f"{self.kind} on job {self.job_id}"


class JobMonitor(models.Model):
    """Per-job monitoring settings and the rules' running state: the GPU-idle auto-stop
    and self-repair choices, and the loss statistics of the run (Welford's mean/M2) with
    how far the log has been scanned for `loss=` values."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="monitor")
    idle_auto_stop = models.BooleanField(default=False)
    idle_minutes = models.PositiveIntegerField(null=True, blank=True)  # None: the default
    # The job's own self-repair choices; None follows its organisation's current default
    # (Tenant.*_default), resolved in one place: jobs.alerts.self_repair_choices.
    # Pause on a loss explosion rather than spend GPU-hours on a diverged run:
    loss_explosion_pause = models.BooleanField(null=True, blank=True, default=None)
    # Move the job off a node whose GPU reports a hardware fault or whose rank is stuck:
    hardware_repair = models.BooleanField(null=True, blank=True, default=None)
    log_scanned_line = models.PositiveBigIntegerField(default=0)
    loss_count = models.PositiveIntegerField(default=0)
    loss_mean = models.FloatField(default=0.0)
    loss_m2 = models.FloatField(default=0.0)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "job__tenant"

    def __str__(self) -> str:
        return f"monitor of job {self.job_id}"
