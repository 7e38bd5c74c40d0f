"""The shared factories and job helpers build consistent rows without the demo catalog."""

import pytest

from jobs.models import JobEvent, JobStatus
from tests.factories import (
    BudgetFactory,
    GpuTypeFactory,
    JobFactory,
    NodePoolFactory,
    PriceEntryFactory,
)
from tests.jobs_helpers import advance, advance_to


def test_a_factory_job_is_queued_on_its_pool(db):
    job = JobFactory()
    assert job.status == JobStatus.QUEUED and not JobEvent.objects.filter(job=job).exists()
    assert (job.backend, job.region, job.gpu_type) == ("local", job.pool.region, None)
    assert (job.nodes, job.on_demand_nodes, job.spot_nodes) == (1, 1, 0)
    assert JobFactory().pool == job.pool  # the same local CPU pool, reused


def test_a_gpu_job_takes_its_pools_type_and_width(db):
    pool = NodePoolFactory(gpu_type=GpuTypeFactory(), backend="kubernetes")
    job = JobFactory(pool=pool)
    assert (job.gpu_type, job.gpus_per_node, job.backend) == (pool.gpu_type, 8, "kubernetes")


def test_other_statuses_come_only_through_the_state_machine(db):
    with pytest.raises(ValueError):
        JobFactory(status=JobStatus.RUNNING)
    job = advance_to(JobFactory(), JobStatus.PAUSED)
    assert job.status == JobStatus.PAUSED
    path = list(JobEvent.objects.filter(job=job).order_by("pk").values_list("to_status", flat=True))
    assert path == [
        JobStatus.DISPATCHING,
        JobStatus.PROVISIONING,
        JobStatus.PAUSING,
        JobStatus.PAUSED,
    ]
    assert advance(job, JobStatus.RESUMING, JobStatus.RUNNING).started_at is not None


def test_catalog_factories(db):
    entry = PriceEntryFactory()
    assert entry.version.spot_discount_percent == 55 and entry.gpu_type is None
    assert BudgetFactory().thresholds == [50, 80, 100]
