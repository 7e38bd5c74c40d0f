"""Volumes: create, resize (up only), delete, the storage quota, and the mount rules a
launch is held to (region, single writer, deleting an attached volume)."""

from __future__ import annotations

import pytest

from console.service_errors import ErrorCode, ServiceError
from jobs.models import JobStatus
from jobs.services import spec_from_job
from marketplace.models import GpuType, TenantQuota
from marketplace.services import tenant_quota_set
from storage import services
from storage.models import Volume, VolumeStatus
from storage.selectors import volume_holders, volumes_for_tenant
from tests.factories import UserFactory, VolumeFactory
from tests.jobs_helpers import advance_to, submit

pytestmark = pytest.mark.django_db


def create(world, name="data", size_gib=10, region="local", **extra) -> Volume:
    return services.volume_create(
        tenant=world.tenant, user=world.member, name=name, size_gib=size_gib, region=region, **extra
    )


def refused(call, *, code=ErrorCode.INVALID, field=None) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        call()
    assert caught.value.code == code, caught.value.message
    if field:
        assert caught.value.field == field
    return caught.value


def test_create_list_resize_delete(world, catalog):
    volume = create(world, access="shared")
    assert (volume.name, volume.size_gib, volume.region.slug, volume.shared) == (
        "data", 10, "local", True,
    )  # fmt: skip
    services.volume_resize(volume=volume, user=world.member, size_gib=25)
    volume.refresh_from_db()
    assert volume.size_gib == 25
    services.volume_delete(volume=volume, user=world.member)
    volume.refresh_from_db()
    assert volume.deleted_at is not None and volume.status == VolumeStatus.DELETED
    assert list(volumes_for_tenant(tenant=world.tenant)) == []
    # The name is free again once deleted.
    assert create(world).pk != volume.pk


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"name": "Data"}, "name"),
        ({"name": "-x"}, "name"),
        ({"name": "a" * 64}, "name"),
        ({"size_gib": 0}, "size_gib"),
        ({"region": "atlantis"}, "region"),
        ({"access": "everyone"}, "access"),
    ],
)
def test_bad_input_is_refused_with_the_field(world, catalog, values, field):
    refused(lambda: create(world, **values), field=field)
    assert not Volume.objects.exists()


def test_a_name_is_unique_per_tenant_not_across_tenants(world, other_world, catalog):
    create(world)
    refused(lambda: create(world), code=ErrorCode.CONFLICT, field="name")
    assert create(other_world).tenant == other_world.tenant


def test_resize_only_grows(world, catalog):
    volume = create(world, size_gib=20)
    error = refused(
        lambda: services.volume_resize(volume=volume, user=world.member, size_gib=10),
        field="size_gib",
    )
    assert "only grow" in error.message
    volume.refresh_from_db()
    assert volume.size_gib == 20


def test_the_staff_storage_quota_bounds_all_volumes(world, catalog):
    staff = UserFactory(is_staff=True)
    tenant_quota_set(
        tenant=world.tenant, gpu_type=None, max_gpus=None, max_concurrent_jobs=None,
        max_storage_gib=100, user=staff,
    )  # fmt: skip
    assert TenantQuota.objects.get(tenant=world.tenant).max_storage_gib == 100
    first = create(world, name="a", size_gib=60)
    error = refused(lambda: create(world, name="b", size_gib=41), field="size_gib")
    assert "100 GiB" in error.message and "60 GiB" in error.message
    create(world, name="b", size_gib=40)
    refused(lambda: services.volume_resize(volume=first, user=world.member, size_gib=61))
    # Deleting frees quota.
    services.volume_delete(volume=first, user=world.member)
    create(world, name="c", size_gib=60)


def test_storage_quota_is_tenant_wide_only(world, catalog):
    staff = UserFactory(is_staff=True)
    gpu_type = GpuType.objects.order_by("pk").first()
    refused(
        lambda: tenant_quota_set(
            tenant=world.tenant,
            gpu_type=gpu_type,
            max_gpus=None,
            max_concurrent_jobs=None,
            max_storage_gib=10,
            user=staff,
        ),
        field="max_storage_gib",
    )


def test_a_job_mounts_a_volume_and_clones_keep_it(world, catalog):
    create(world)
    job = submit(world, volumes=[{"name": "data", "path": "/data", "read_only": False}])
    assert spec_from_job(job).volumes == [{"name": "data", "path": "/data", "read_only": False}]


def test_a_volume_of_another_region_or_tenant_is_refused(world, other_world, catalog):
    create(world, name="far", region="us-east")
    create(other_world, name="theirs")
    error = refused(lambda: submit(world, volumes=[{"name": "far", "path": "/data"}]),
                    field="volumes")  # fmt: skip
    assert "us-east" in error.message and "local" in error.message
    refused(lambda: submit(world, volumes=[{"name": "theirs", "path": "/data"}]), field="volumes")
    refused(lambda: submit(world, volumes=[{"name": "nothing", "path": "/data"}]), field="volumes")


def test_a_single_writer_volume_has_one_writer_and_names_it(world, catalog):
    create(world)
    holder = submit(world, "holder", volumes=[{"name": "data", "path": "/data"}])
    error = refused(
        lambda: submit(world, "second", volumes=[{"name": "data", "path": "/data"}]),
        code=ErrorCode.CONFLICT,
        field="volumes",
    )
    assert f"#{holder.pk}" in error.message and "holder" in error.message
    # Read-only is fine beside the writer.
    submit(world, "reader", volumes=[{"name": "data", "path": "/data", "read_only": True}])
    # Once the holder ends, another job may write.
    advance_to(holder, JobStatus.CANCELLED)
    submit(world, "next", volumes=[{"name": "data", "path": "/data"}])


def test_a_shared_volume_has_many_writers(world, catalog):
    create(world, access="shared")
    submit(world, "one", volumes=[{"name": "data", "path": "/data"}])
    submit(world, "two", volumes=[{"name": "data", "path": "/data"}])


def test_deleting_an_attached_volume_is_refused_naming_the_job(world, catalog):
    volume = create(world)
    job = submit(world, "trainer", volumes=[{"name": "data", "path": "/data", "read_only": True}])
    assert list(volume_holders(volume=volume)) == [job]
    error = refused(
        lambda: services.volume_delete(volume=volume, user=world.member), code=ErrorCode.CONFLICT
    )
    assert f"#{job.pk}" in error.message and "trainer" in error.message
    volume.refresh_from_db()
    assert volume.deleted_at is None
    advance_to(job, JobStatus.CANCELLED)
    services.volume_delete(volume=volume, user=world.member)


@pytest.mark.parametrize(
    "volumes",
    [
        [{"name": "data", "path": "data"}],
        [{"name": "data", "path": "/proc"}],
        [{"name": "data", "path": "/sys/fs"}],
        [{"name": "data", "path": "/dev/shm"}],
        [{"name": "data", "path": "/"}],
        [{"name": "data", "path": "/a/../b"}],
        [{"name": "data", "path": "/data/"}],
        [{"name": "data", "path": "/data", "read_only": "yes"}],
        [{"name": "data", "path": "/data", "extra": 1}],
        [{"name": "data", "path": "/x"}, {"name": "other", "path": "/x"}],
        [{"name": "data", "path": "/x"}, {"name": "data", "path": "/y"}],
        "data:/data",
    ],
)
def test_bad_mounts_are_refused(world, catalog, volumes):
    create(world)
    VolumeFactory(tenant=world.tenant, name="other")
    refused(lambda: submit(world, volumes=volumes), field="volumes")
