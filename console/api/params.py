"""Query parameters read through a serializer: the same class is the operation's
parameter list in the schema (`extend_schema(parameters=[TheSerializer])`) and the
validator of the request, so the two can't disagree. Invalid values are a 400 in the
error envelope, never silently ignored (and text with NUL, which PostgreSQL can't
compare, never reaches a query)."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.request import Request

from console.api.fields import FROM_QUERY_STRING


def query_params(serializer_class: type[serializers.Serializer], request: Request) -> dict:
    # A plain dict, not the QueryDict: DRF reads a QueryDict as an HTML form, where an
    # empty value means "not given"; here `?available=` is not a boolean.
    data = serializer_class(data=request.query_params.dict(), context={FROM_QUERY_STRING: True})
    data.is_valid(raise_exception=True)
    return dict(data.validated_data)
