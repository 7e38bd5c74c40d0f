"""The volume provider jobs asks (jobs.extensions.VolumeProvider): which volumes a spec
may mount, recording them with the job, and what its backend mounts.

The single-writer rule lives here once: a single-writer volume is mounted read-write by
at most one job that isn't finished. Launch checks it before the job is recorded and
again inside the launch transaction with the volumes locked."""

from __future__ import annotations

from console.models import Tenant
from console.service_errors import ErrorCode, ServiceError
from jobs.extensions import VolumeMount
from jobs.models import Job
from marketplace.models import Region
from storage.models import FILL_ACTIVE, Volume, VolumeAccess, VolumeAttachment
from storage.selectors import volume_attachments_of_jobs, volume_holders, volumes_for_tenant


def _resolve(*, tenant: Tenant, region: Region, mounts: list[dict], lock: bool) -> list[Volume]:
    names = [mount["name"] for mount in mounts]
    volumes = volumes_for_tenant(tenant=tenant).filter(name__in=names)
    if lock:
        volumes = volumes.select_for_update(of=("self",))
    by_name = {volume.name: volume for volume in volumes}
    resolved = []
    for mount in mounts:
        volume = by_name.get(mount["name"])
        if volume is None:
            raise ServiceError(f"No volume named {mount['name']}.", field="volumes")
        if volume.region_id != region.pk:
            raise ServiceError(
                f"Volume {volume.name} is in {volume.region.slug}; this job runs in "
                f"{region.slug}. A volume is only usable in its region.",
                field="volumes",
            )
        if not mount["read_only"] and volume.fills.filter(status__in=FILL_ACTIVE).exists():
            raise ServiceError(
                f"Volume {volume.name} is being filled; mount it read-write once the copy "
                "ends (read-only now).",
                code=ErrorCode.CONFLICT,
                field="volumes",
            )
        if volume.access == VolumeAccess.SINGLE_WRITER and not mount["read_only"]:
            holder = volume_holders(volume=volume, writers_only=True).first()
            if holder is not None:
                raise ServiceError(
                    f"Volume {volume.name} is single-writer and job #{holder.pk} "
                    f"“{holder.name}” ({holder.get_status_display().lower()}) holds it "
                    "read-write; mount it read-only or wait for that job to end.",
                    code=ErrorCode.CONFLICT,
                    field="volumes",
                )
        resolved.append(volume)
    return resolved


def read_only_mounts(*, tenant: Tenant, region: Region, mounts: list[dict]) -> list[VolumeMount]:
    """Volumes of `tenant` in `region` named by `mounts` ({"name", "path"}), as read-only
    mounts (a service's replicas share them: model weights). A ServiceError names a
    volume that is gone or in another region."""
    mounts = [{**mount, "read_only": True} for mount in mounts]
    volumes = _resolve(tenant=tenant, region=region, mounts=mounts, lock=False)
    return [
        VolumeMount(
            volume_id=volume.pk,
            name=volume.name,
            path=mount["path"],
            read_only=True,
            size_gib=volume.size_gib,
            shared=volume.shared,
        )
        for volume, mount in zip(volumes, mounts, strict=True)
    ]


class StorageVolumeProvider:
    def check_mounts(self, *, tenant: Tenant, region: Region, mounts: list[dict]) -> None:
        if mounts:
            _resolve(tenant=tenant, region=region, mounts=mounts, lock=False)

    def attach(self, *, job: Job, mounts: list[dict]) -> None:
        if not mounts:
            return
        volumes = _resolve(tenant=job.tenant, region=job.region, mounts=mounts, lock=True)
        VolumeAttachment.objects.bulk_create(
            VolumeAttachment(
                job=job,
                volume=volume,
                path=mount["path"],
                read_only=mount["read_only"],
                position=position,
            )
            for position, (volume, mount) in enumerate(zip(volumes, mounts, strict=True))
        )

    def mounts_for(self, job: Job) -> list[VolumeMount]:
        return self.mounts_for_jobs([job])[job.pk]

    def mounts_for_jobs(self, jobs: list[Job]) -> dict[int, list[VolumeMount]]:
        mounts: dict[int, list[VolumeMount]] = {job.pk: [] for job in jobs}
        for attachment in volume_attachments_of_jobs(jobs=jobs):
            mounts[attachment.job_id].append(
                VolumeMount(
                    volume_id=attachment.volume_id,
                    name=attachment.volume.name,
                    path=attachment.path,
                    read_only=attachment.read_only,
                    size_gib=attachment.volume.size_gib,
                    shared=attachment.volume.shared,
                )
            )
        return mounts
