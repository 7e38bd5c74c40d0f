"""Services, their immutable revisions, replicas and access tokens.

A `Service` is the desired state (what the user asked for); a `ServiceRevision` is an
immutable snapshot of what its replicas run (image, command, env, resources, port). Any
change of those makes a new revision; a rollback makes a new revision that copies an
earlier one (`copied_from`), so revision numbers only grow and "what runs now" is always
the service's `current_revision`. `ServiceReplica` rows are what the reconcile service
started; the gateway routes only to READY ones. `ServiceScaleEvent` rows say why the
wanted replica count changed (services.autoscale decides it from the gateway's counters).
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from console.tenancy import TenantOwnedModel, TenantScopedQuerySet
from jobs.models import Priority

DNS_LABEL = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
    "Use lowercase letters, digits and hyphens (a DNS label, at most 63 characters).",
)


class ServiceStatus(models.TextChoices):
    DEPLOYING = "deploying", "Deploying"
    READY = "ready", "Ready"
    DEGRADED = "degraded", "Degraded"
    SCALED_TO_ZERO = "scaled_to_zero", "Scaled to zero"
    FAILED = "failed", "Failed"
    PAUSED = "paused", "Paused: budget used up"


class ServiceAuth(models.TextChoices):
    PUBLIC = "public", "Public"
    TOKEN = "token", "Service token"


class ReplicaState(models.TextChoices):
    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    STOPPED = "stopped", "Stopped"


class AutoscaleMetric(models.TextChoices):
    # RPS and concurrency: what the console measures at its gateway. CPU utilisation: a
    # Kubernetes HorizontalPodAutoscaler's (services on a cluster only).
    RPS = "rps", "Requests per second per replica"
    CONCURRENCY = "concurrency", "Requests in flight per replica"
    CPU = "cpu", "CPU utilisation (%), by the cluster's autoscaler"
    GPU = "gpu", "GPU utilisation (%), by the cluster's autoscaler"


# Utilisation metrics: a Kubernetes HorizontalPodAutoscaler decides the count, never the
# console's autoscaler.
CLUSTER_METRICS = (AutoscaleMetric.CPU, AutoscaleMetric.GPU)


class ScaleWindow(models.TextChoices):
    """Which rule decided a change of the wanted replica count."""

    STABLE = "stable", "Stable window"
    PANIC = "panic", "Panic window"
    COLD_START = "cold_start", "Request at zero"
    IDLE = "idle", "Idle: scaled to zero"
    BOUNDS = "bounds", "Minimum/maximum"
    BUDGET = "budget", "Budget used up"
    HPA = "hpa", "Cluster's autoscaler (CPU or GPU)"


class Service(TenantOwnedModel):
    """One HTTP endpoint of a tenant, served by `min_replicas`…`max_replicas` replicas."""

    name = models.CharField(max_length=63, validators=[DNS_LABEL])
    region = models.ForeignKey("marketplace.Region", on_delete=models.PROTECT, related_name="+")
    # Where its replicas run (chosen at creation from the region's pools).
    pool = models.ForeignKey("marketplace.NodePool", on_delete=models.PROTECT, related_name="+")
    image = models.CharField(max_length=300)
    command = models.JSONField(default=list)
    env = models.JSONField(default=dict, blank=True)
    # Organisation secrets by name: each replica gets their values when it starts.
    secrets = models.JSONField(default=list, blank=True)
    # Volumes of the organisation, mounted read-only in every replica (model weights):
    # [{"name": "weights", "path": "/models"}].
    volumes = models.JSONField(default=list, blank=True)
    port = models.PositiveIntegerField()
    cpus = models.PositiveSmallIntegerField(default=1)
    # GPU replicas (on a cluster): the pool's GPU type, chosen at creation, and how many
    # of them each replica gets (0: a CPU service).
    gpu_type = models.ForeignKey(
        "marketplace.GpuType", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    gpus_per_replica = models.PositiveSmallIntegerField(default=0)
    min_replicas = models.PositiveSmallIntegerField(default=2)
    max_replicas = models.PositiveSmallIntegerField(default=10)
    readiness_path = models.CharField(max_length=200, default="/")
    autoscale_metric = models.CharField(
        max_length=12, choices=AutoscaleMetric.choices, default=AutoscaleMetric.CONCURRENCY
    )
    # Per replica: requests in flight, or requests per second.
    autoscale_target = models.FloatField(default=10)
    # The autoscaler's last decision (min_replicas until traffic says otherwise).
    desired_replicas = models.PositiveSmallIntegerField(default=0)
    # Panic mode (a burst at 2x capacity) lasts a stable window after the last burst;
    # meanwhile the wanted count never goes down.
    panic_until = models.DateTimeField(null=True, blank=True)
    # Seconds the traffic must have wanted fewer replicas before the count goes down.
    scale_down_delay = models.PositiveIntegerField(default=300)
    # Since when the traffic has wanted fewer replicas than desired_replicas (None: not).
    scale_down_wanted_since = models.DateTimeField(null=True, blank=True)
    auth = models.CharField(max_length=8, choices=ServiceAuth.choices, default=ServiceAuth.TOKEN)
    # As jobs': a used-up budget scales a non-critical service to zero until it is raised.
    priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.NORMAL)
    paused_by_budget = models.BooleanField(default=False)
    status = models.CharField(
        max_length=16, choices=ServiceStatus.choices, default=ServiceStatus.DEPLOYING
    )
    status_reason = models.CharField(max_length=300, blank=True, default="")
    # Replicas of the current revision that ended without being asked to (crash loops
    # make the service "failed").
    restarts = models.PositiveIntegerField(default=0)
    current_revision = models.ForeignKey(
        "ServiceRevision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="service_name_per_tenant"),
            models.CheckConstraint(
                condition=models.Q(min_replicas__lte=models.F("max_replicas")),
                name="service_min_le_max",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def panicking(self) -> bool:
        """A burst made the autoscaler panic (scale up at once, not down) recently."""
        return self.panic_until is not None and self.panic_until > timezone.now()


class ServiceRevision(models.Model):
    """What a service's replicas run; never changed once written."""

    tenant_field = "service__tenant"

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    image = models.CharField(max_length=300)
    command = models.JSONField(default=list)
    env = models.JSONField(default=dict, blank=True)
    secrets = models.JSONField(default=list, blank=True)  # names, never values
    volumes = models.JSONField(default=list, blank=True)  # by name, read-only
    port = models.PositiveIntegerField()
    cpus = models.PositiveSmallIntegerField()
    gpus_per_replica = models.PositiveSmallIntegerField(default=0)
    # A rollback copies an earlier revision into a new one.
    copied_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-number"]
        constraints = [
            models.UniqueConstraint(fields=["service", "number"], name="service_revision_number")
        ]

    def __str__(self) -> str:
        return f"{self.service.name} r{self.number}"


class ServiceTokenQuerySet(TenantScopedQuerySet):
    def active(self):
        return self.filter(revoked_at__isnull=True)


class ServiceToken(models.Model):
    """A bearer token for one service's endpoint; stored only as a hash (as ApiToken)."""

    PREFIX = "ggs_"
    tenant_field = "service__tenant"

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ServiceTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ServiceReplica(models.Model):
    """One running copy of a revision: a sandboxed process on the console's host, reached
    on `host_port` of the loopback; or a pod of the service's Deployment on a cluster,
    reached at `host` (its pod IP) and the revision's port, mirrored from the pod."""

    tenant_field = "service__tenant"

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="replicas")
    revision = models.ForeignKey(ServiceRevision, on_delete=models.PROTECT, related_name="+")
    host_port = models.PositiveIntegerField(null=True, blank=True)
    host = models.CharField(max_length=64, blank=True, default="")  # empty: the loopback
    # The backend's name for it (a process's run directory, a pod's name).
    handle = models.CharField(max_length=120, blank=True, default="")
    state = models.CharField(
        max_length=10, choices=ReplicaState.choices, default=ReplicaState.STARTING
    )
    reason = models.CharField(max_length=300, blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    # When the gateway stopped sending it new requests (it stops once idle).
    draining_at = models.DateTimeField(null=True, blank=True)
    # When it was seen stopped or asked to stop: the end of its metered time.
    stopped_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["started_at", "pk"]

    def __str__(self) -> str:
        return f"{self.service.name} replica {self.pk}"


class ServiceScaleEvent(models.Model):
    """One change of a service's wanted replica count, with what the autoscaler saw: the
    metric's average over the stable and panic windows, requests held at zero, and, for a
    start from zero, how long the first replica took to be ready."""

    tenant_field = "service__tenant"

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="scale_events")
    at = models.DateTimeField(default=timezone.now)
    from_replicas = models.PositiveSmallIntegerField()
    to_replicas = models.PositiveSmallIntegerField()
    window = models.CharField(max_length=12, choices=ScaleWindow.choices)
    metric = models.CharField(max_length=12, choices=AutoscaleMetric.choices)
    target = models.FloatField()
    stable_value = models.FloatField()
    panic_value = models.FloatField()
    held_requests = models.PositiveIntegerField(default=0)
    # From the first request held at zero to the first replica ready (seconds).
    cold_start_seconds = models.FloatField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["service", "-at"], name="service_scale_event_at")]

    def __str__(self) -> str:
        return f"{self.service.name}: {self.from_replicas} → {self.to_replicas} ({self.window})"
