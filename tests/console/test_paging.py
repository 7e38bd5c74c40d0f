"""Capped counts (console.paging): at most COUNT_CAP rows are counted, and "more than
COUNT_CAP" (true as long as a list only grows) is kept a while per query instead of
counting COUNT_CAP + 1 rows on every first page; exact counts are never kept."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console import paging
from console.models import Tenant
from console.paging import capped_count
from tests.factories import TenantFactory
from tests.jobs.test_api import JOBS, launch, member_api

__all__ = ["member_api"]  # the fixture, imported for these tests
pytestmark = pytest.mark.django_db


@pytest.fixture
def cap_of_three(monkeypatch):
    monkeypatch.setattr(paging, "COUNT_CAP", 3)
    monkeypatch.setattr(paging, "_over_cap", type(paging._over_cap)())


def counting_queries(queryset) -> tuple[tuple[int, bool], int]:
    with CaptureQueriesContext(connection) as queries:
        answer = capped_count(queryset)
    return answer, len(queries)


def test_an_exact_count_below_the_cap_is_counted_every_time(cap_of_three):
    TenantFactory.create_batch(2)
    assert counting_queries(Tenant.objects.all()) == ((2, False), 1)
    TenantFactory()
    assert counting_queries(Tenant.objects.all()) == ((3, False), 1)


def test_more_than_the_cap_is_kept_for_a_while_per_query(cap_of_three, monkeypatch):
    TenantFactory.create_batch(4)
    assert counting_queries(Tenant.objects.all()) == ((3, True), 1)
    assert counting_queries(Tenant.objects.all()) == ((3, True), 0)  # kept
    # Another question is counted for itself.
    assert counting_queries(Tenant.objects.filter(slug="none")) == ((0, False), 1)
    Tenant.objects.all().delete()  # (a bulk purge) seen once the answer is old enough
    assert counting_queries(Tenant.objects.all()) == ((3, True), 0)
    later = paging.time.monotonic() + paging.OVER_CAP_KEPT_SECONDS + 1
    monkeypatch.setattr(paging.time, "monotonic", lambda: later)
    assert counting_queries(Tenant.objects.all()) == ((0, False), 1)


def test_the_job_list_says_more_than_the_cap_without_counting_again(member_api, cap_of_three):
    for number in range(4):
        launch(member_api, name=f"job {number}")
    first = member_api.get(f"{JOBS}?page_size=2").json()
    assert (first["count"], first["count_capped"]) == (3, True)
    with CaptureQueriesContext(connection) as queries:
        again = member_api.get(f"{JOBS}?page_size=2").json()
    assert (again["count"], again["count_capped"]) == (3, True)
    assert not any("COUNT(" in query["sql"].upper() for query in queries)
    filtered = member_api.get(f"{JOBS}?page_size=2&status=succeeded").json()
    assert (filtered["count"], filtered["count_capped"]) == (0, False)
