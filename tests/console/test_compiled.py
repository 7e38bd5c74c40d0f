"""Queries compiled once per process (console.compiled) return what the ORM returns, for
every value they are run with, on this database."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count, Q, Value
from django.utils import timezone

from console.compiled import compiled, compiled_first, compiled_instances
from console.models import Tenant
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def tenants_made_at(hours_ago: list[int]) -> list[Tenant]:
    now = timezone.now()
    return [
        TenantFactory(slug=f"t-{uuid.uuid4().hex[:8]}", created_at=now - timedelta(hours=hours))
        for hours in hours_ago
    ]


def test_a_compiled_query_is_the_orm_query_with_each_run_s_values():
    tenants = tenants_made_at([1, 2, 3, 4])
    key = ("test-since", uuid.uuid4().hex)
    built = []

    def build(at):
        built.append(1)
        return (
            Tenant.objects.filter(created_at__gte=at.datetime("since"))
            .exclude(pk=at.int("not"))
            .order_by("pk")
            .values_list("pk", "slug", "created_at")
        )

    for hours, left_out in ((2.5, tenants[0]), (3.5, tenants[1]), (0.5, tenants[0])):
        since = timezone.now() - timedelta(hours=hours)
        expected = list(
            Tenant.objects.filter(created_at__gte=since)
            .exclude(pk=left_out.pk)
            .order_by("pk")
            .values_list("pk", "slug", "created_at")
        )
        assert compiled(key, build).rows(since=since, **{"not": left_out.pk}) == expected
    assert len(built) == 1  # compiled once, run three times
    assert expected == []  # the last window holds only the one left out


def test_an_aggregate_without_grouping_gives_one_row_by_column_name():
    tenants = tenants_made_at([1, 5])
    query = compiled(
        ("test-count", uuid.uuid4().hex),
        lambda at: (
            Tenant.objects.filter(pk__in=[at.int("a"), at.int("b")])
            .order_by()
            .values(one=Value(1))
            .annotate(
                recent=Count("pk", filter=Q(created_at__gte=at.datetime("since"))), all=Count("pk")
            )
        ),
    )

    since = timezone.now() - timedelta(hours=2)
    row = query.first(a=tenants[0].pk, b=tenants[1].pk, since=since)

    assert row == {"one": 1, "recent": 1, "all": 2}
    assert query.first(a=-1, b=-2, since=since) == {"one": 1, "recent": 0, "all": 0}


def test_instances_and_first_are_the_orm_s():
    first, second = tenants_made_at([1, 2])

    def named(at):
        return Tenant.objects.filter(slug__in=[at.text("one"), at.text("two")])

    got = compiled_instances("test-named", Tenant, lambda at: named(at).order_by("pk"),
                             one=first.slug, two=second.slug)  # fmt: skip
    found = compiled_first("test-named", Tenant, named, one=second.slug, two="nobody")
    missing = compiled_first("test-named", Tenant, named, one="no", two="body")

    assert got == [first, second]
    assert [t.created_at for t in got] == [first.created_at, second.created_at]
    assert found == second and found.name == second.name
    assert missing is None


def test_a_stand_in_the_query_never_uses_is_refused():
    with pytest.raises(ValueError, match="'unused' is not a parameter"):
        compiled(
            ("test-unused", uuid.uuid4().hex),
            lambda at: Tenant.objects.filter(pk=at.int("used"), name=str(at.int("unused"))),
        )


@pytest.mark.django_db(transaction=True)  # the other thread must see the row
def test_a_query_compiled_in_one_thread_runs_in_another_on_its_own_connection():
    # Each ASGI request runs its sync code in a new thread: a query compiled by one
    # request is reused by the next, converted on that thread's connection.
    (tenant,) = tenants_made_at([1])
    built = []

    def build(at):
        built.append(1)
        return Tenant.objects.filter(pk=at.int("pk")).values_list("pk", "created_at")

    key = ("test-threads", uuid.uuid4().hex)
    here = compiled(key, build).rows(pk=tenant.pk)
    there = []

    def run_elsewhere():
        try:
            there.append(compiled(key, build).rows(pk=tenant.pk))
        finally:
            connection.close()  # that thread's own connection

    thread = threading.Thread(target=run_elsewhere)
    thread.start()
    thread.join()
    assert there == [here]
    assert here == [(tenant.pk, tenant.created_at)]
    assert len(built) == 1
