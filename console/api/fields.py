"""JSON values of the types the schema says: the project's text and boolean fields.

DRF coerces: a text field turns a JSON number into its digits (`{"name": 0}` names a
token "0"), a boolean field takes 0, 1 and "true". The schema says `type: string` and
`type: boolean`, and the API keeps that promise: in a JSON body, a text field takes
only a string and a boolean field only true or false; anything else is a 400. Forms and
query strings carry only strings: there, DRF's parsing of "true"/"false" still applies
(see console.api.params).

Our serializers declare these classes (never DRF's CharField or BooleanField; checked by
tests/test_architecture.py), and model serializers derive from `StrictModelSerializer`,
whose field mapping generates them. DRF's own classes are left as they are.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.http import QueryDict
from rest_framework import serializers

FROM_QUERY_STRING = "from_query_string"  # serializer context key set by console.api.params


def _from_json(field: serializers.Field) -> bool:
    data = getattr(field.root, "initial_data", None)
    return (
        isinstance(data, dict | list)
        and not isinstance(data, QueryDict)
        and not field.context.get(FROM_QUERY_STRING)
    )


class StrictCharField(serializers.CharField):
    """Text: only a string (DRF's CharField turns numbers and booleans into text)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# DRF's text fields that refine CharField, strict the same way (each keeps its own
# "invalid" message: "Enter a valid email address.", …).
class StrictEmailField(StrictCharField, serializers.EmailField):
    pass


class StrictSlugField(StrictCharField, serializers.SlugField):
    pass


class StrictURLField(StrictCharField, serializers.URLField):
    pass


class StrictRegexField(StrictCharField, serializers.RegexField):
    pass


class StrictIPAddressField(StrictCharField, serializers.IPAddressField):
    pass


class StrictBooleanField(serializers.BooleanField):
    """A boolean: in a JSON body only true or false (DRF also takes 0, 1, "yes"…); in a
    form or query string DRF's reading of "true"/"false" stays."""

    def to_internal_value(self, data: Any) -> bool:
        if _from_json(self) and not isinstance(data, bool):
            self.fail("invalid", input=data)
        return super().to_internal_value(data)


class StrictDecimalField(serializers.DecimalField):
    """A decimal: in a JSON body only a string, as the schema says decimals travel (DRF
    also takes a JSON number, which may have lost digits on its way as a float)."""

    def to_internal_value(self, data: Any):
        if _from_json(self) and not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# The base of every model serializer of ours: the fields it generates from text and
# boolean model fields are the strict ones above. (A comment, not a docstring: the
# schema would show an inherited docstring as every such serializer's description.)
class StrictModelSerializer(serializers.ModelSerializer):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.BooleanField: StrictBooleanField,
        models.CharField: StrictCharField,
        models.TextField: StrictCharField,
        models.EmailField: StrictEmailField,
        models.SlugField: StrictSlugField,
        models.URLField: StrictURLField,
        models.GenericIPAddressField: StrictIPAddressField,
    }
