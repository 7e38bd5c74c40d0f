"""A dev environment: a tenant's named box to work on (SSH from a laptop), run as a job.

The environment is the lasting thing (its spec, its home volume, its SSH host key); each
start is a new job (`current_job`) built from it, so admission, dispatch, metering and
budgets are the jobs' own. `status` follows the current job's status
(environments.services.environment_sync is the one place that sets it)."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from console.tenancy import TenantOwnedModel

DNS_LABEL = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z",
    "Use lower-case letters, digits and hyphens (a DNS label, at most 63 characters).",
)


class EnvironmentStatus(models.TextChoices):
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    IDLE_WARNING = "idle_warning", "Idle: stopping soon"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed"


# An environment in one of these has a job that may still run (or is about to).
ACTIVE_STATUSES = frozenset(
    {
        EnvironmentStatus.STARTING,
        EnvironmentStatus.RUNNING,
        EnvironmentStatus.IDLE_WARNING,
        EnvironmentStatus.STOPPING,
    }
)


class Interactive(models.TextChoices):
    SSH = "ssh", "SSH"
    JUPYTER = "jupyter", "Jupyter"
    BOTH = "both", "SSH and Jupyter"


class Environment(TenantOwnedModel):
    name = models.CharField(max_length=63, validators=[DNS_LABEL])
    created_by = models.ForeignKey(
        "console.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    region = models.ForeignKey("marketplace.Region", on_delete=models.PROTECT, related_name="+")
    gpu_type = models.ForeignKey(
        "marketplace.GpuType", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    gpus_per_node = models.PositiveSmallIntegerField(default=0)
    cpus = models.PositiveSmallIntegerField(null=True, blank=True)
    image = models.CharField(max_length=100)
    interactive = models.CharField(max_length=8, choices=Interactive.choices, default="ssh")
    # Mounted read-write at /workspace (the sandbox user's home) on every start.
    home_volume = models.ForeignKey("storage.Volume", on_delete=models.PROTECT, related_name="+")
    # More mounts, as a job spec's `volumes` ([{"name", "path", "read_only"}]).
    volumes = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    # Organisation secrets by name, as a job spec's `secrets`.
    secrets = models.JSONField(default=list, blank=True)
    idle_policy = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=16, choices=EnvironmentStatus.choices, default=EnvironmentStatus.STOPPED
    )
    status_reason = models.CharField(max_length=300, blank=True)
    current_job = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The sshd host key, kept across starts so a laptop's known_hosts entry stays valid:
    # the private key encrypted at rest (console.crypto), the public key in OpenSSH form.
    host_key_encrypted = models.TextField()
    host_key_public = models.TextField()
    # SSH through the gateway: set when a connection opens and while it stays open.
    last_activity_at = models.DateTimeField(null=True, blank=True)
    # "Keep running" (the page's button, POST …/keep-alive): activity until then.
    keep_alive_until = models.DateTimeField(null=True, blank=True)
    # The stop the idle rule's warning announced; cleared by activity or a new start.
    # While set, a running environment reads as idle_warning.
    idle_stop_at = models.DateTimeField(null=True, blank=True)
    # Stopped, with a policy that deletes it: when its creator was told the date (once).
    deletion_noticed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"], name="environment_name_unique_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES
