"""The API's JSON parser: DRF's, refusing NUL characters anywhere in the document and
documents nested deeper than any request of the API is."""

from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

NUL_MESSAGE = "Contains a NUL character, which can't be stored."
# No request body of the API nests more than a few levels (a job's ports: an object in a
# list in an object). Deeper documents are refused before anything walks them: Python's
# json decoder recurses once per level and fails with RecursionError (a 500) at about a
# thousand, and so would everything that walks the data afterwards.
MAX_JSON_DEPTH = 32
DEPTH_MESSAGE = f"The JSON document is nested deeper than {MAX_JSON_DEPTH} levels."


def _within_depth(data) -> bool:
    """Whether no list or object in `data` lies deeper than MAX_JSON_DEPTH (iterative)."""
    pending = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return False
        pending.extend((child, depth + 1) for child in children)
    return True


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
    fields refuse NUL themselves; this also covers keys and free-form JSON values.

    Too deep a document is a 400 (`parse_error`) like any malformed one: the decoder's
    RecursionError is caught here, and what decodes is measured before it is walked."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(DEPTH_MESSAGE) from None
        if not _within_depth(data):
            raise ParseError(DEPTH_MESSAGE)
        if isinstance(data, dict):
            # Named by the top-level field it is in, as any invalid field is.
            fields = sorted(str(k) for k, v in data.items() if _has_nul(k) or _has_nul(v))
            if fields:
                raise ValidationError({name: [NUL_MESSAGE] for name in fields})
        elif _has_nul(data):
            raise ParseError(NUL_MESSAGE)
        return data
