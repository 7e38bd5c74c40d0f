"""Reads of volumes, always through the tenant scope."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db.models import Prefetch, QuerySet, Sum

from console.models import Tenant
from jobs.backends import ComputeBackend, get_backend
from jobs.models import FINISHED, Job
from marketplace.models import NodePool, PriceVersion, StoragePrice
from storage.models import Volume, VolumeAttachment, VolumeFill


def volumes_for_tenant(*, tenant: Tenant | None) -> QuerySet[Volume]:
    """The tenant's volumes that exist (not deleted), with their region."""
    return Volume.objects.for_tenant(tenant).filter(deleted_at=None).select_related("region")


def with_latest_fill(volumes: QuerySet[Volume]) -> QuerySet[Volume]:
    """`volumes`, each with `latest_fills` ([its newest fill] or []) in one more query."""
    return volumes.prefetch_related(
        Prefetch(
            "fills",
            queryset=VolumeFill.objects.order_by("-created_at", "-pk")[:1],
            to_attr="latest_fills",
        )
    )


def latest_fill(volume: Volume) -> VolumeFill | None:
    prefetched = getattr(volume, "latest_fills", None)
    if prefetched is not None:
        return prefetched[0] if prefetched else None
    return volume.fills.order_by("-created_at", "-pk").first()


def volume_backend(*, volume: Volume) -> ComputeBackend | None:
    """The configured backend whose pools serve the volume's region (where its storage
    lives), or None."""
    names = set(NodePool.objects.filter(region=volume.region_id).values_list("backend", flat=True))
    name = next((name for name in settings.COMPUTE_BACKENDS if name in names), None)
    return get_backend(name) if name is not None else None


def volume_storage_gib(*, tenant: Tenant) -> int:
    """GiB provisioned by the tenant's existing volumes (what its storage quota bounds)."""
    total = volumes_for_tenant(tenant=tenant).aggregate(total=Sum("size_gib"))["total"]
    return int(total or 0)


def volume_holders(*, volume: Volume, writers_only: bool = False) -> QuerySet[Job]:
    """Jobs not yet finished that mount `volume` (read-write ones only, if asked): they
    hold it, from launch until they end."""
    attachments = VolumeAttachment.objects.filter(volume=volume)
    if writers_only:
        attachments = attachments.filter(read_only=False)
    return (
        Job.objects.filter(pk__in=attachments.values("job_id"))
        .exclude(status__in=FINISHED)
        .order_by("pk")
    )


def volume_attachments_of(*, job: Job) -> QuerySet[VolumeAttachment]:
    return volume_attachments_of_jobs(jobs=[job])


def volume_attachments_of_jobs(*, jobs: list[Job]) -> QuerySet[VolumeAttachment]:
    return (
        VolumeAttachment.objects.filter(job__in=[job.pk for job in jobs])
        .select_related("volume")
        .order_by("job_id", "position")
    )


def storage_prices_per_gib_month() -> dict[int, tuple[Decimal, str]]:
    """The price of a GiB-month of volume storage by region id, in the price-book version
    in force now, with its currency (volumes are billed by the GiB-hour at 1/730 of it)."""
    version = PriceVersion.objects.in_force()
    if version is None:
        return {}
    return {
        price.region_id: (price.price_per_gib_month, version.currency)
        for price in StoragePrice.objects.filter(version=version)
    }
