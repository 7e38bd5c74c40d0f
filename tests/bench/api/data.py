"""Benchmark data: a tenant with many finished jobs, as metering leaves them (events, a
closed meter and ledger records each), written in bulk (the state machine would take
hours for 100,000 jobs; these rows are what it would have written)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from billing.models import JobMeter, UsageRecord
from jobs.actors import ActorKind
from jobs.models import Job, JobEvent, JobStatus
from marketplace.models import Image, NodePool, PriceVersion

BATCH = 2000
TIMELINE = (
    ("", JobStatus.QUEUED, "submitted"),
    (JobStatus.QUEUED, JobStatus.DISPATCHING, "admitted"),
    (JobStatus.DISPATCHING, JobStatus.PROVISIONING, "submitted to the cluster"),
    (JobStatus.PROVISIONING, JobStatus.RUNNING, "running"),
    (JobStatus.RUNNING, JobStatus.SUCCEEDED, "completed"),
)


def make_finished_jobs(tenant, user, count: int) -> None:
    """`count` succeeded one-node GPU jobs of one hour each, spread over the last year."""
    pool = NodePool.objects.filter(gpu_type__isnull=False, is_active=True).first()
    assert pool is not None, "the catalog needs a GPU pool"
    image = Image.objects.filter(tenant__isnull=True).first()
    version = PriceVersion.objects.in_force()
    now = timezone.now()
    for offset in range(0, count, BATCH):
        jobs = []
        for index in range(offset, min(count, offset + BATCH)):
            created = now - timedelta(minutes=5 * (count - index))
            jobs.append(
                Job(
                    tenant=tenant,
                    created_by=user,
                    name=f"bench-{index}",
                    image=image,
                    image_reference=image.reference,
                    command=["torchrun", "train.py", f"--run={index}"],
                    gpu_type=pool.gpu_type,
                    gpus_per_node=pool.gpus_per_node or 1,
                    cpus=8,
                    region=pool.region,
                    backend=pool.backend,
                    pool=pool,
                    on_demand_nodes=1,
                    status=JobStatus.SUCCEEDED,
                    status_reason="completed",
                    status_changed_at=created + timedelta(hours=1, minutes=2),
                    exit_code=0,
                    run_seconds=3600,
                    created_at=created,
                    started_at=created + timedelta(minutes=2),
                    finished_at=created + timedelta(hours=1, minutes=2),
                )
            )
        jobs = Job.objects.bulk_create(jobs)
        events, meters, records = [], [], []
        for job in jobs:
            for step, (before, after, reason) in enumerate(TIMELINE):
                at = (
                    job.created_at + timedelta(minutes=min(step, 2))
                    if step < 4
                    else job.finished_at
                )
                events.append(
                    JobEvent(
                        job=job,
                        at=at,
                        from_status=before,
                        to_status=after,
                        actor_kind=ActorKind.SYSTEM,
                        reason=reason,
                    )
                )
            meters.append(JobMeter(job=job, metered_until=job.finished_at, open=False))
            units = job.gpus_per_node
            price = Decimal("1.79")
            records.append(
                UsageRecord(
                    tenant=tenant,
                    job=job,
                    job_ref=job.pk,
                    job_name=job.name,
                    attempt=1,
                    tier="on_demand",
                    gpu_type=job.gpu_type,
                    region=job.region,
                    interval_start=job.started_at,
                    interval_end=job.finished_at,
                    units=units,
                    gpu_seconds=Decimal(3600 * units),
                    price_version=version,
                    unit_price=price,
                    amount=price * units,
                    on_demand_amount=price * units,
                    currency="USD",
                )
            )
        JobEvent.objects.bulk_create(events)
        JobMeter.objects.bulk_create(meters)
        UsageRecord.objects.bulk_create(records)


def make_running_jobs(tenant, user, count: int) -> int:
    """`count` jobs running for the last half hour, not metered yet (each is priced live
    on every read), spread over every priced GPU pool and 1 to 4 GPUs a node; returns how
    many configurations (GPU type, region, GPUs a node) they make."""
    version = PriceVersion.objects.in_force()
    priced = set(version.entries.values_list("gpu_type_id", "region_id"))
    pools = [
        pool
        for pool in NodePool.objects.filter(gpu_type__isnull=False, is_active=True).order_by("pk")
        if (pool.gpu_type_id, pool.region_id) in priced
    ]
    assert pools, "the catalog needs a priced GPU pool"
    image = Image.objects.filter(tenant__isnull=True).first()
    started = timezone.now() - timedelta(minutes=30)
    jobs = []
    for index in range(count):
        pool = pools[index % len(pools)]
        jobs.append(
            Job(
                tenant=tenant,
                created_by=user,
                name=f"live-{index}",
                image=image,
                image_reference=image.reference,
                command=["torchrun", "train.py", f"--run={index}"],
                gpu_type=pool.gpu_type,
                gpus_per_node=1 + (index // len(pools)) % 4,
                cpus=8,
                region=pool.region,
                backend=pool.backend,
                pool=pool,
                on_demand_nodes=1,
                status=JobStatus.RUNNING,
                status_reason="running",
                status_changed_at=started + timedelta(minutes=2),
                created_at=started - timedelta(seconds=index),
                started_at=started + timedelta(minutes=2),
            )
        )
    jobs = Job.objects.bulk_create(jobs)
    JobEvent.objects.bulk_create(
        JobEvent(
            job=job,
            at=job.created_at + timedelta(minutes=min(step, 2)),
            from_status=before,
            to_status=after,
            actor_kind=ActorKind.SYSTEM,
            reason=reason,
        )
        for job in jobs
        for step, (before, after, reason) in enumerate(TIMELINE[:4])
    )
    return len({(job.gpu_type_id, job.region_id, job.gpus_per_node) for job in jobs})
