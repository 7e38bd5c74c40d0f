"""Counting long lists without counting every row: at most COUNT_CAP rows are counted,
so a tenant with 100,000 jobs doesn't pay a full COUNT on every page view (its pages say
"10,000+"), and `CappedPaginator` pages long HTML lists with that count."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

COUNT_CAP = 10_000
# "More than COUNT_CAP" stays true as a list grows (jobs, events and audit entries are
# only added, or purged in bulk long after), so that answer is kept this long per query
# instead of reading COUNT_CAP + 1 index entries on every first page. Exact counts
# (below the cap) are never kept.
OVER_CAP_KEPT_SECONDS = 60
OVER_CAP_KEPT_QUERIES = 1024

_over_cap: OrderedDict[tuple, float] = OrderedDict()
_over_cap_lock = threading.Lock()


def capped_count(rows: QuerySet) -> tuple[int, bool]:
    """How many rows, at most COUNT_CAP, and whether there are more (counted by their
    ids alone: not what the rows read for display)."""
    capped = rows.order_by().values("pk")[: COUNT_CAP + 1]
    sql, params = capped.query.sql_with_params()
    key, count = (capped.db, sql, tuple(map(repr, params))), capped.count
    now = time.monotonic()
    with _over_cap_lock:
        until = _over_cap.get(key)
    if until is not None and now < until:
        return COUNT_CAP, True
    counted = count()
    if counted > COUNT_CAP:
        with _over_cap_lock:
            _over_cap[key] = now + OVER_CAP_KEPT_SECONDS
            _over_cap.move_to_end(key)
            while len(_over_cap) > OVER_CAP_KEPT_QUERIES:
                _over_cap.popitem(last=False)
    return min(counted, COUNT_CAP), counted > COUNT_CAP


class CappedPaginator(Paginator):
    """`count_queryset`: what to count when the listed queryset carries joins or
    subqueries for display that a count doesn't need."""

    capped = False  # set when there are more than COUNT_CAP rows

    def __init__(self, object_list, per_page, *, count_queryset=None, **kwargs):
        super().__init__(object_list, per_page, **kwargs)
        self.count_queryset = count_queryset if count_queryset is not None else object_list

    @cached_property
    def count(self) -> int:
        counted, self.capped = capped_count(self.count_queryset)
        return counted
