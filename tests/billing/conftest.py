from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest

from billing.models import LiveUsageRollup
from jobs.models import Job, JobEvent, JobStatus
from jobs.services import JobSpec, job_submit

S = JobStatus


@pytest.fixture
def catalog(db):
    from jobs.backends.local import LocalBackend
    from marketplace.demo import seed_catalog
    from marketplace.services import capacity_sync

    seed_catalog()
    capacity_sync(backend=LocalBackend())


def make_job(world, *, name="train", cpus=1, priority="normal", project="", start=None):
    """A local CPU job whose timeline we write by hand (no process is started)."""
    job = job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=JobSpec(
            name=name,
            image="python-3.11",
            command=["true"],
            cpus=cpus,
            priority=priority,
            project=project,
        ),
    )
    if start is not None:
        Job.objects.filter(pk=job.pk).update(created_at=start - timedelta(seconds=5))
    return job


def set_status(job, to, at, attempt=None):
    """Write a status change at a given time (bypassing the process world)."""
    JobEvent.objects.create(
        job=job,
        at=at,
        from_status=job.status,
        to_status=to,
        actor="test",
        attempt=attempt or job.attempt,
    )
    updates = {"status": to, "status_changed_at": at}
    if to == S.RUNNING and job.started_at is None:
        updates["started_at"] = at
    if attempt:
        updates["attempt"] = attempt
    Job.objects.filter(pk=job.pk).update(**updates)
    job.refresh_from_db()
    return job


T0 = datetime(2026, 11, 2, 10, 0, 0, tzinfo=UTC)


ROLLUP_SUMS = ("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount")


def live_rollups(**filters) -> dict[tuple, tuple[Decimal, ...]]:
    """The job rollups as readers see them, a key's rows summed (the closed hours' row
    and a meter's open hour): {(bucket, start, job, GPU type, tier, region): sums}."""
    sums: dict[tuple, list[Decimal]] = {}
    for row in LiveUsageRollup.objects.filter(**filters):
        key = (row.bucket, row.bucket_start, row.job_ref, row.gpu_type, row.tier, row.region)
        values = sums.setdefault(key, [Decimal(0)] * 4)
        for i, field in enumerate(ROLLUP_SUMS):
            values[i] += getattr(row, field)
    return {key: tuple(values) for key, values in sums.items()}


def live_rollup(**filters) -> SimpleNamespace:
    """The one job rollup matching `filters`, its rows summed."""
    (key, sums), *others = live_rollups(**filters).items()
    assert not others, f"more than one rollup matches {filters}"
    names = ("bucket", "bucket_start", "job_ref", "gpu_type", "tier", "region")
    return SimpleNamespace(**dict(zip(names, key, strict=True)), **dict(zip(ROLLUP_SUMS, sums)))
