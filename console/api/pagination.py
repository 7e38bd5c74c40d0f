"""The API's page envelopes.

`PageSizePagination` ({count, next, previous, results}, `?page=`) serves short lists.
Long, growing lists (a tenant's jobs, a job's events, the audit log) use
`CursorCountPagination`: `?cursor=` pages (opaque links in `next`/`previous`) that cost
the same on page 1 and page 2,000, and, on the first page only, a `count` capped at
10,000 (`count_capped` says when there are more; later pages give null for both)
instead of counting every row on every page. `?page=` still works
there, for clients written against the page-number envelope.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination, PageNumberPagination
from rest_framework.response import Response

from console.paging import COUNT_CAP, OVER_CAP_KEPT_SECONDS, capped_count

PAGE_SIZE_MAXIMUM = 500


class StrictPageSize:
    """`page` and `page_size` as the schema says: whole numbers from 1 (400 otherwise,
    where DRF would quietly use the first page or the default size); a page size above
    the maximum is cut to the maximum, a page past the end is DRF's 404."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = PAGE_SIZE_MAXIMUM

    def get_page_size(self, request) -> int:
        page = request.query_params.get("page")
        if page is not None and not re.fullmatch(r"[0-9]+|last", page):
            raise ValidationError({"page": ["A whole number from 1."]})
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not re.fullmatch(r"[0-9]+", raw) or int(raw) < 1:
            raise ValidationError({self.page_size_query_param: ["A whole number from 1."]})
        return min(int(raw), self.max_page_size)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)  # type: ignore[misc]
        for parameter in parameters:
            if parameter["name"] in (self.page_size_query_param, "page"):
                parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["description"] = f"Results per page (at most {self.max_page_size})."
        return parameters


class PageSizePagination(StrictPageSize, PageNumberPagination):
    """The one page envelope of every API list: {count, next, previous, results}."""


class CursorCountPagination(StrictPageSize, CursorPagination):
    """Cursor pages of a list ordered by `ordering` (newest first by default), with a
    capped count; `?page=N` falls back to page numbers."""

    ordering = ("-created_at", "-id")

    def paginate_queryset(self, queryset, request, view=None):
        self._by_page = None
        if "page" in request.query_params:
            self._by_page = PageSizePagination()
            return self._by_page.paginate_queryset(queryset, request, view)
        self.count, self.count_capped = None, None
        self._model = queryset.model
        if not request.query_params.get(self.cursor_query_param):
            # The first page counts, over at most COUNT_CAP + 1 rows (an index-only scan
            # however long the list); the pages after it don't count again.
            self.count, self.count_capped = capped_count(queryset)
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        # A cursor is the client's to edit: a position that isn't a value of the ordering
        # column is an invalid cursor (404, as DRF answers a garbled one), not a 500.
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            column = self._model._meta.get_field(self.ordering[0].lstrip("-"))
            try:
                column.to_python(cursor.position)
            except DjangoValidationError:
                raise NotFound(self.invalid_cursor_message) from None
        return cursor

    def get_paginated_response(self, data):
        if self._by_page is not None:
            return self._by_page.get_paginated_response(data)
        return Response(
            {
                "count": self.count,
                "count_capped": self.count_capped,
                "next": self.get_next_link(),
                "previous": self.get_previous_link(),
                "results": data,
            }
        )

    def get_paginated_response_schema(self, schema):
        envelope = super().get_paginated_response_schema(schema)
        envelope["properties"] = {
            "count": {
                "type": "integer",
                "nullable": True,
                "example": 123,
                "description": f"on the first page: how many items, at most {COUNT_CAP}",
            },
            "count_capped": {
                "type": "boolean",
                "nullable": True,
                "description": f"on the first page: true when there are more than {COUNT_CAP}"
                f" (that answer may be up to {OVER_CAP_KEPT_SECONDS} s old)",
            },
            **envelope["properties"],
        }
        return envelope

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        return [
            *parameters,
            {
                "name": "page",
                "required": False,
                "in": "query",
                "description": "A page number instead of a cursor (the count is then exact).",
                "schema": {"type": "integer", "minimum": 1},
            },
        ]


class EventCursorPagination(CursorCountPagination):
    """A job's events, oldest first (a timeline)."""

    ordering = ("at", "id")
