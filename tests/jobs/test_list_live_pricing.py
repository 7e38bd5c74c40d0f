"""A page of running jobs (each priced live, not metered yet) across many
configurations costs the same queries as one of a single configuration: live prices come
from the in-memory price book, not a read per GPU type, region or size (issue 27)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobs.models import JobStatus
from marketplace.models import Image, NodePool, PriceVersion
from tests.conftest import signed_in_client, token_client
from tests.factories import JobFactory
from tests.jobs_helpers import advance_to

JOBS_API = "/api/v1/jobs?page_size=50"


def run_jobs(world, count: int, *, configurations: int) -> set[tuple]:
    """`count` running jobs over the first `configurations` (GPU pool, GPUs a node)
    pairs of the priced GPU pools; returns the configurations they make."""
    priced = set(PriceVersion.objects.in_force().entries.values_list("gpu_type_id", "region_id"))
    pools = [
        pool
        for pool in NodePool.objects.filter(gpu_type__isnull=False, is_active=True).order_by("pk")
        if (pool.gpu_type_id, pool.region_id) in priced
    ]
    choices = [(pool, gpus) for gpus in (1, 2, 4) for pool in pools][:configurations]
    image = Image.objects.filter(tenant__isnull=True).first()
    made = set()
    for index in range(count):
        pool, gpus = choices[index % len(choices)]
        job = JobFactory(
            tenant=world.tenant,
            pool=pool,
            gpus_per_node=gpus,
            cpus=4,
            image=image,
            name=f"live-{index}",
        )
        advance_to(job, JobStatus.RUNNING)
        made.add((pool.gpu_type_id, pool.region_id, gpus))
    return made


def queries(client, url: str) -> int:
    client.get(url)  # warm-up: a token's or session's first use writes
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


@pytest.mark.parametrize("page", ["api", "html"])
def test_live_page_query_count_does_not_grow_with_configurations(
    world, catalog, page, django_assert_max_num_queries
):
    client = (
        token_client(world.member, world.tenant)
        if page == "api"
        else signed_in_client(world.member, world.tenant)
    )
    url = JOBS_API if page == "api" else reverse("jobs:list")
    assert len(run_jobs(world, 2, configurations=1)) == 1
    one_configuration = queries(client, url)
    assert len(run_jobs(world, 48, configurations=30)) >= 10
    with django_assert_max_num_queries(one_configuration):
        response = client.get(url)
    if page == "api":
        rows = response.json()["results"]
        assert len(rows) == 50 and all(row["status"] == JobStatus.RUNNING for row in rows)
        assert all(row["price_per_hour"] is not None for row in rows)
    else:
        assert len(response.context["rows"]) == 50
