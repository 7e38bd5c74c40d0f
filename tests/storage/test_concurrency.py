"""Single-writer exclusion under concurrent launches: of several launches racing for one
single-writer volume read-write, exactly one is recorded; the others are refused (409)
naming it. (Proven on PostgreSQL, whose row locks it relies on; SQLite serializes.)"""

from __future__ import annotations

import threading

import pytest

from console.service_errors import ErrorCode, ServiceError
from jobs.services import JobSpec, job_submit
from storage.models import VolumeAttachment
from tests.concurrency import run_at_once
from tests.factories import VolumeFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_launches_take_a_single_writer_volume_once(world, catalog):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    refusals: list[ServiceError] = []
    lock = threading.Lock()

    def launch() -> None:
        spec = JobSpec(
            name="racer",
            image="python-3.11",
            command=["python", "-c", "pass"],
            cpus=1,
            volumes=[{"name": "data", "path": "/data"}],
        )
        try:
            job_submit(tenant=world.tenant, user=world.member, spec=spec)
        except ServiceError as error:
            with lock:
                refusals.append(error)

    run_at_once(launch, copies=4)
    (holder,) = VolumeAttachment.objects.filter(volume=volume)
    assert len(refusals) == 3
    assert all(r.code == ErrorCode.CONFLICT and f"#{holder.job_id}" in r.message for r in refusals)
