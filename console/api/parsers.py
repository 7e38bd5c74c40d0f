"""The API's JSON parser: DRF's, refusing NUL characters anywhere in the document."""

from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

NUL_MESSAGE = "Contains a NUL character, which can't be stored."


def _has_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(map(_has_nul, value))
    return False


class JSONParser(parsers.JSONParser):
    """PostgreSQL can hold NUL neither in text nor in jsonb, so a NUL in any string or
    key (a port's name, a label's key) would fail in the database as a 500. DRF's text
    fields refuse NUL themselves; this also covers keys and free-form JSON values."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        if isinstance(data, dict):
            # Named by the top-level field it is in, as any invalid field is.
            fields = sorted(str(k) for k, v in data.items() if _has_nul(k) or _has_nul(v))
            if fields:
                raise ValidationError({name: [NUL_MESSAGE] for name in fields})
        elif _has_nul(data):
            raise ParseError(NUL_MESSAGE)
        return data
