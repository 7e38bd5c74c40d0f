"""JSON values of the types the schema says, for every serializer at once.

DRF coerces: a text field turns a JSON number into its digits (`{"name": 0}` names a
token "0"), a boolean field takes 0, 1 and "true". The schema says `type: string` and
`type: boolean`, and the API keeps that promise: in a JSON body, a text field takes
only a string and a boolean field only true or false; anything else is a 400. It is
installed on DRF's fields from ConsoleConfig.ready() so that it holds for every text
and boolean field (explicit, model-generated, nested) without a copy in each
serializer. Forms and query strings carry only strings: there, DRF's parsing of
"true"/"false" still applies (see console.api.params)."""

from __future__ import annotations

from django.http import QueryDict
from rest_framework import serializers

FROM_QUERY_STRING = "from_query_string"  # serializer context key set by console.api.params

_drf_text_value = serializers.CharField.to_internal_value
_drf_boolean_value = serializers.BooleanField.to_internal_value


def _from_json(field: serializers.Field) -> bool:
    data = getattr(field.root, "initial_data", None)
    return (
        isinstance(data, dict | list)
        and not isinstance(data, QueryDict)
        and not field.context.get(FROM_QUERY_STRING)
    )


def _text_only(self: serializers.CharField, data):
    if not isinstance(data, str):
        self.fail("invalid")
    return _drf_text_value(self, data)


def _json_boolean_only(self: serializers.BooleanField, data):
    if _from_json(self) and not isinstance(data, bool):
        self.fail("invalid", input=data)
    return _drf_boolean_value(self, data)


def json_types_as_documented() -> None:
    serializers.CharField.to_internal_value = _text_only  # type: ignore[method-assign]
    serializers.BooleanField.to_internal_value = _json_boolean_only  # type: ignore[method-assign]
