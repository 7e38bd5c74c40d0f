"""Compiled rows for pagers (console.compiled.CompiledValues) are the ORM's rows: for each
window, ordering and cursor position, and through DRF's cursor pages both ways."""

from __future__ import annotations

import uuid
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.db.models import F
from django.db.models.functions import Upper
from django.utils import timezone
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from console.compiled import CompiledValues
from console.models import Tenant
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db

NEWEST_FIRST = ("-created_at", "-id")


def scope(at):
    return Tenant.objects.exclude(pk=at.int("not"))


def shape(tenants):
    return tenants.annotate(shout=Upper("slug"), when=F("created_at")).values(
        "id", "slug", "shout", "when", "created_at"
    )


@pytest.fixture
def tenants() -> list[Tenant]:
    now = timezone.now()
    # Two pairs made at the same instant: a cursor's position alone can't tell them apart.
    return [
        TenantFactory(slug=f"t-{uuid.uuid4().hex[:8]}", created_at=now - timedelta(hours=hours))
        for hours in (1, 2, 2, 3, 4, 4, 5)
    ]


def rows_of(left_out: Tenant, **kwargs) -> CompiledValues:
    return CompiledValues(("test-rows", uuid.uuid4().hex), Tenant, scope, shape,
                          {"not": left_out.pk}, **kwargs)  # fmt: skip


def test_windows_and_positions_are_the_orm_s_rows(tenants):
    left_out = tenants[3]
    rows = rows_of(left_out)
    expected = shape(Tenant.objects.exclude(pk=left_out.pk))
    position = str(tenants[2].created_at)  # as DRF's cursor carries it
    for ordering in (NEWEST_FIRST, ("created_at", "id")):
        ordered, orm = rows.order_by(*ordering), expected.order_by(*ordering)
        assert ordered.ordered and not rows.ordered
        for start, stop in ((0, 2), (1, 4), (0, 50), (5, 6), (9, 12)):
            assert ordered[start:stop] == list(orm[start:stop])
        for operator in ("lt", "gt"):
            lookup = {f"created_at__{operator}": position}
            assert ordered.filter(**lookup)[0:3] == list(orm.filter(**lookup)[0:3])
            assert list(ordered.filter(**lookup).queryset()) == list(orm.filter(**lookup))
    assert rows.count(at_most=3) == 3
    assert rows.count(at_most=100) == Tenant.objects.count() - 1


def test_each_shape_is_compiled_once_whatever_its_values(tenants):
    built = []

    def counted_scope(at):
        built.append(1)
        return scope(at)

    key = ("test-once", uuid.uuid4().hex)
    for left_out in tenants[:3]:
        rows = CompiledValues(key, Tenant, counted_scope, shape, {"not": left_out.pk})
        newest = rows.order_by(*NEWEST_FIRST)
        assert left_out.pk not in [row["id"] for row in newest[0:10]]
        newest.filter(created_at__lt=str(left_out.created_at))[0:2]
        rows.count(at_most=10)
    assert len(built) == 3  # the page, the page after a position, the count


def test_only_a_cursor_s_position_filter_is_taken(tenants):
    rows = rows_of(tenants[0])
    with pytest.raises(TypeError):
        rows.filter(slug="x")
    with pytest.raises(TypeError):
        rows.filter(created_at__lt="2026-01-01", id__lt=3)
    with pytest.raises(TypeError):
        rows.filter(created_at__lt="2026-01-01").filter(created_at__gt="2025-01-01")


class TwoNewestFirst(CursorPagination):
    page_size, ordering = 2, NEWEST_FIRST


def page_of(source, url: str) -> tuple[list[int], TwoNewestFirst]:
    pager = TwoNewestFirst()
    page = pager.paginate_queryset(source, Request(APIRequestFactory().get(url)))
    return [row["id"] for row in page], pager


def walk(source, direction: str, url: str = "/rows") -> list[list[int]]:
    """The ids of every page DRF's cursor pagination gives, following `direction` links."""
    pages = []
    while url:
        ids, pager = page_of(source, url)
        pages.append(ids)
        link = pager.get_next_link() if direction == "next" else pager.get_previous_link()
        url = link and "/rows?" + urlsplit(link).query
    return pages


def test_drf_cursor_pages_are_the_same_both_ways(tenants):
    left_out = tenants[-1]
    rows = rows_of(left_out)
    orm = shape(Tenant.objects.exclude(pk=left_out.pk))

    forward = walk(rows, "next")
    assert forward == walk(orm, "next")
    assert [pk for page in forward for pk in page] == list(
        orm.order_by(*NEWEST_FIRST).values_list("id", flat=True)
    )
    # Back from the last page: its cursors carry positions, and offsets past the ties.
    url = "/rows"
    for _ in forward[1:]:
        url = "/rows?" + urlsplit(page_of(orm, url)[1].get_next_link()).query
    backward = walk(rows, "previous", url)
    assert backward == walk(orm, "previous", url)
    assert backward == forward[::-1]
