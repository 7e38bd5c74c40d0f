"""The OpenAPI schema's one place for what every operation may answer besides success,
and for the request constraints DRF checks but drf-spectacular doesn't write down.

Each operation gets the error responses it can actually produce, decided from the
operation itself (its body, parameters, security and path) rather than by hand per view:

- 400 when it reads a body or query parameters (invalid input, `detail` + field messages);
- 401 and 403 when it needs credentials (none or bad ones; a role that may not);
- 404 when it names an object in its path, pages through a list (a page past the end),
  or hides itself from non-staff;
- 409 when it changes state (the object is not in a state that allows it, a name taken).

A view declares what is special to it (402 for a launch refused by a budget, 429 for a
locked-out sign-in) in its `extend_schema(responses=...)`; what it declares is kept.
"""

from __future__ import annotations

import re

from django.core import validators
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

from console.api.fields import StrictCharField
from console.permissions import IsPlatformStaffElseNotFound

ERROR_DESCRIPTIONS = {
    "400": "Invalid input: `detail` says why; each invalid field has its messages under "
    "its own name.",
    "401": "No valid credentials: the token is missing, unknown, revoked or expired.",
    "402": "Payment required: a used-up budget refuses it.",
    "403": "Authenticated, but this role or token may not do this.",
    "404": "No such object in the caller's organisation (another's is a 404 too), or a "
    "page past the end of the list.",
    "409": "The object is not in a state that allows this, or the name is taken.",
    "429": "Too many attempts; try again later.",
}
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
PAGE_PARAMETERS = frozenset({"page", "cursor"})
# Non-blank text after DRF trims it (str.strip): at least one character that is
# whitespace neither to Python nor to the schema's regex dialect (ECMA-262, whose \s
# leaves out the separators U+001C-U+001F and NEL U+0085 that str.strip removes).
NOT_ONLY_WHITESPACE = r"[^\s\x1c-\x1f\x85]"
# A decimal as text with at least one digit: "12", "12.5", "12.", ".5", "-3.25".
DECIMAL_PATTERN = r"^-?(?:\d{{1,{whole}}}(?:\.\d{{0,{places}}})?|\.\d{{1,{places}}})$"


class ErrorSerializer(serializers.Serializer):
    """Every refusal of the API, whatever refused it (a validator, a permission, a
    service, an unknown URL): `detail` for people, `code` for programs, and for invalid
    input each field's messages under the field's name (e.g. `"name": ["…"]`)."""

    detail = StrictCharField(help_text="What went wrong, in a sentence.")
    code = StrictCharField(help_text="What went wrong, as a word: invalid, not_found, conflict, …")


class ApiAutoSchema(AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        error = self.resolve_serializer(ErrorSerializer, "response").ref
        responses = operation["responses"]
        for code in sorted(self._error_statuses(operation)):
            if code not in responses:
                responses[code] = {"content": {"application/json": {"schema": error}}}
        for code, response in responses.items():
            if code in ERROR_DESCRIPTIONS and not response.get("description"):
                response["description"] = ERROR_DESCRIPTIONS[code]
        return operation

    def _error_statuses(self, operation: dict) -> set[str]:
        parameters = operation.get("parameters", [])
        query = {p["name"] for p in parameters if p["in"] == "query"}
        statuses = set()
        if operation.get("requestBody") or query:
            statuses.add("400")
        if operation.get("security"):
            statuses |= {"401", "403"}
        hidden = any(
            isinstance(permission, type) and issubclass(permission, IsPlatformStaffElseNotFound)
            for permission in getattr(self.view, "permission_classes", ())
        )
        if any(p["in"] == "path" for p in parameters) or query & PAGE_PARAMETERS or hidden:
            statuses.add("404")
        if self.method in UNSAFE_METHODS:
            statuses.add("409")
        return statuses

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if not isinstance(schema, dict):
            return schema
        # DRF refuses an empty list where allow_empty is False; say so.
        if isinstance(field, serializers.ListField | serializers.ListSerializer) and (
            not getattr(field, "allow_empty", True)
        ):
            schema.setdefault("minItems", 1)
        # drf-spectacular's decimal pattern makes every digit optional, so "" and "-"
        # would be valid; DRF wants a number.
        if (
            direction == "request"
            and isinstance(field, serializers.DecimalField)
            and field.max_digits is not None
            and field.decimal_places
            and schema.get("type") == "string"
        ):
            whole = max(field.max_digits - field.decimal_places, 1)
            schema["pattern"] = DECIMAL_PATTERN.format(whole=whole, places=field.decimal_places)
        # DRF trims text before its blank check: "  " is as blank as "".
        if (
            direction == "request"
            and isinstance(field, serializers.CharField)
            and not field.allow_blank
            and field.trim_whitespace
            and schema.get("type") == "string"
            and not {"pattern", "format", "enum"} & schema.keys()
            and not any(isinstance(v, validators.RegexValidator) for v in field.validators)
        ):
            schema["pattern"] = NOT_ONLY_WHITESPACE
        return schema


def add_create_links(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: OpenAPI links from each create (a POST on a
    collection answering 201) to every operation on the object it created (read, act,
    delete), fed with the created object's lookup value. Clients and stateful fuzzers
    (schemathesis) follow them: create → read → act → delete."""
    paths = result.get("paths", {})
    schemas = result.get("components", {}).get("schemas", {})
    for path, item in paths.items():
        created = item.get("post", {}).get("responses", {}).get("201")
        if created is None or "{" in path or not path.endswith("/"):
            continue
        body = created.get("content", {}).get("application/json", {}).get("schema", {})
        properties = schemas.get(body.get("$ref", "").rsplit("/", 1)[-1], {}).get("properties", {})
        links = {}
        for target_path, target in paths.items():
            match = re.fullmatch(re.escape(path) + r"\{(\w+)\}/?([^{]*)", target_path)
            if match is None or match.group(1) not in properties:
                continue
            lookup = match.group(1)
            for method, operation in target.items():
                if method in ("get", "put", "patch", "post", "delete"):
                    links[operation["operationId"]] = {
                        "operationId": operation["operationId"],
                        "parameters": {lookup: f"$response.body#/{lookup}"},
                    }
        if links:
            created["links"] = links
    return result
