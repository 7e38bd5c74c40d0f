"""Pages of long HTML lists: a Paginator that counts at most COUNT_CAP rows, so a tenant
with 100,000 jobs doesn't pay a full COUNT on every page view (its pages say "200+")."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.utils.functional import cached_property

from console.api.pagination import COUNT_CAP


class CappedPaginator(Paginator):
    """`count_queryset`: what to count when the listed queryset carries joins or
    subqueries for display that a count doesn't need."""

    capped = False  # set when there are more than COUNT_CAP rows

    def __init__(self, object_list, per_page, *, count_queryset=None, **kwargs):
        super().__init__(object_list, per_page, **kwargs)
        self.count_queryset = count_queryset if count_queryset is not None else object_list

    @cached_property
    def count(self) -> int:
        counted = self.count_queryset.order_by()[: COUNT_CAP + 1].count()
        self.capped = counted > COUNT_CAP
        return min(counted, COUNT_CAP)
