"""Running jobs are priced from the price book offers read (kept in memory) after their
tenant's discount: a page of them costs the same queries however many configurations it
shows, and each rate is the estimate's hourly figure."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from billing.job_costs import job_run_rate, jobs_costs_to_date
from jobs.models import Job, JobStatus
from marketplace.models import Region, TenantPricing
from marketplace.pricing import estimate_cost
from tests.billing.conftest import make_job, set_status
from tests.conftest import signed_in_client, token_client

PAGE = 50
CONFIGURATIONS = 11  # 1 to 11 vCPUs


def run_jobs(world, cpus_each: list[int]) -> None:
    started = timezone.now() - timedelta(minutes=5)
    for number, cpus in enumerate(cpus_each):
        set_status(
            make_job(world, name=f"run {cpus}-{number}", cpus=cpus), JobStatus.RUNNING, started
        )


def queries(call) -> int:
    with CaptureQueriesContext(connection) as captured:
        call()
    return len(captured)


def test_a_page_of_running_jobs_costs_the_same_queries_whatever_its_configurations(world, catalog):
    TenantPricing.objects.create(tenant=world.tenant, discount_percent=Decimal(10))
    api = token_client(world.member, world.tenant)
    page = signed_in_client(world.member, world.tenant)
    list_api = lambda: api.get(f"/api/v1/jobs?page_size={PAGE}")  # noqa: E731
    list_page = lambda: page.get(reverse("jobs:list"))  # noqa: E731
    run_jobs(world, [1, 1])
    for read in (list_api, list_page):
        read()  # the token and the price book are kept from here on
    one = {read: queries(read) for read in (list_api, list_page)}
    one_costs = queries(lambda: jobs_costs_to_date(list(Job.objects.all())))

    run_jobs(world, [1 + n % CONFIGURATIONS for n in range(PAGE - 2)])
    jobs = list(Job.objects.all())
    assert len({(job.cpus, job.status) for job in jobs}) == CONFIGURATIONS
    assert {job.status for job in jobs} == {JobStatus.RUNNING}
    assert queries(list_api) <= one[list_api]
    assert queries(list_page) <= one[list_page]
    assert queries(lambda: jobs_costs_to_date(jobs)) <= one_costs
    assert len(list_api().json()["results"]) == PAGE
    assert all(Decimal(cost) > 0 for cost in jobs_costs_to_date(jobs).values())


def test_a_run_rate_is_the_estimate_s_hourly_price_after_the_discount(world, catalog):
    TenantPricing.objects.create(tenant=world.tenant, discount_percent=Decimal("12.5"))
    run_jobs(world, [3])
    job = Job.objects.select_related("region", "tenant").get()
    estimate = estimate_cost(
        gpu_type=None, region=job.region, nodes=job.nodes, cpus=job.cpus, tenant=job.tenant
    )
    assert estimate.tenant_discount_percent == Decimal("12.5")
    assert job_run_rate(job) == estimate.unit_price_base * job.cpus * job.nodes > 0


def test_a_job_still_running_in_a_withdrawn_region_keeps_its_price(world, catalog):
    run_jobs(world, [2])
    job = Job.objects.get()
    rate = job_run_rate(job)
    region = Region.objects.get(pk=job.region_id)
    region.is_active = False
    region.save()  # the offers drop it; the job runs on
    assert rate is not None and job_run_rate(job) == rate
