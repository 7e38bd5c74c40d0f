"""A volume (a tenant's named storage in one region) and its attachments to jobs."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from console.tenancy import TenantOwnedModel


class VolumeAccess(models.TextChoices):
    SINGLE_WRITER = "single_writer", "Single writer"
    SHARED = "shared", "Shared (many jobs)"


class VolumeStatus(models.TextChoices):
    AVAILABLE = "available", "Available"
    DELETED = "deleted", "Deleted"


class Volume(TenantOwnedModel):
    """Named storage of one tenant in one region. Deleting keeps the row (marked
    `deleted_at`) so that metering knows when the volume stopped existing; its name is
    free again at once."""

    tenant = models.ForeignKey("console.Tenant", on_delete=models.CASCADE, related_name="volumes")
    name = models.CharField(max_length=63)
    size_gib = models.PositiveIntegerField()
    region = models.ForeignKey("marketplace.Region", on_delete=models.PROTECT, related_name="+")
    access = models.CharField(
        max_length=16, choices=VolumeAccess.choices, default=VolumeAccess.SINGLE_WRITER
    )
    status = models.CharField(
        max_length=16, choices=VolumeStatus.choices, default=VolumeStatus.AVAILABLE
    )
    created_by = models.ForeignKey(
        "console.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"],
                condition=Q(deleted_at=None),
                name="volume_name_unique_per_tenant",
            ),
            models.CheckConstraint(condition=Q(size_gib__gte=1), name="volume_size_positive"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def shared(self) -> bool:
        return self.access == VolumeAccess.SHARED


class VolumeAttachment(models.Model):
    """A job's mount of a volume, recorded at launch; it holds the volume while the job
    is not finished."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="+")
    volume = models.ForeignKey(Volume, on_delete=models.PROTECT, related_name="attachments")
    path = models.CharField(max_length=400)
    read_only = models.BooleanField(default=False)
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["job", "position"]
        constraints = [
            models.UniqueConstraint(fields=["job", "volume"], name="attachment_once_per_job"),
            models.UniqueConstraint(fields=["job", "path"], name="attachment_one_per_path"),
        ]

    def __str__(self) -> str:
        return f"{self.volume_id} at {self.path}"


class FillStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Copying"
    SUCCEEDED = "succeeded", "Done"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


FILL_ACTIVE = (FillStatus.QUEUED, FillStatus.RUNNING)


class VolumeFill(models.Model):
    """A copy into a volume from an HTTP(S) URL or an object-store prefix, run by the
    console's worker. At most one is active (queued or copying) per volume; the files
    land in the volume only once the whole copy succeeded."""

    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="fills")
    source = models.CharField(max_length=2000)
    # s3:// sources: the S3-compatible service's URL ("" = AWS).
    endpoint = models.CharField(max_length=400, blank=True)
    # An organisation secret by name (S3: "ACCESS_KEY_ID:SECRET"; HTTP: a bearer token).
    secret = models.CharField(max_length=100, blank=True)
    status = models.CharField(max_length=16, choices=FillStatus.choices, default=FillStatus.QUEUED)
    bytes_done = models.BigIntegerField(default=0)
    bytes_total = models.BigIntegerField(null=True, blank=True)
    files_done = models.PositiveIntegerField(default=0)
    error = models.CharField(max_length=1000, blank=True)
    created_by = models.ForeignKey(
        "console.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Which run of the copy owns the row: a run counts it up when it starts, and only
    # the newest run's progress and end are recorded (an older one stops at its next
    # progress report). The sweep starts a new run when the last sign of life is old.
    attempt = models.PositiveSmallIntegerField(default=0)
    touched_at = models.DateTimeField(default=timezone.now)  # queued, started or copied

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["volume"],
                condition=Q(status__in=["queued", "running"]),
                name="volume_one_active_fill",
            )
        ]

    def __str__(self) -> str:
        return f"fill of {self.volume_id} from {self.source}"

    @property
    def active(self) -> bool:
        return self.status in FILL_ACTIVE
