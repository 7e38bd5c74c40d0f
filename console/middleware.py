"""Request middleware: the tenant of a browser request, the API body size limit, and no
NUL in an API URL."""

from __future__ import annotations

import io

from django.conf import settings
from django.http import HttpRequest

from console.api.errors import json_error
from console.selectors import memberships_and_current
from console.tenancy import SESSION_TENANT_KEY


class CurrentTenantMiddleware:
    """Sets request.tenant / request.membership from the session's chosen tenant."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        memberships, membership = memberships_and_current(
            request.user, request.session.get(SESSION_TENANT_KEY)
        )
        request.my_memberships = memberships  # the tenant switcher's list
        request.membership = membership
        request.tenant = membership.tenant if membership else None
        return self.get_response(request)


class ApiBodyLimitMiddleware:
    """Refuses an API request body larger than DATA_UPLOAD_MAX_MEMORY_SIZE with 413,
    before anything parses it.

    DRF's parsers read the request stream themselves (Django's own check on
    `request.body` never runs), so without this a client could make the web process load
    any JSON body it sends, signed in or not (`POST /api/v1/auth/token`). A body with a
    Content-Length is judged by it; a chunked one is read up to the limit, never beyond,
    and handed on as an ordinary body of that length."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        if request.path.startswith("/api/") and request.method not in ("GET", "HEAD", "OPTIONS"):
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            if limit is not None and not self._within(request, limit):
                return json_error(
                    413, f"The request body is larger than {limit} bytes.", "payload_too_large"
                )
        return self.get_response(request)

    @staticmethod
    def _within(request: HttpRequest, limit: int) -> bool:
        length = request.META.get("CONTENT_LENGTH")
        if length:
            try:
                return int(length) <= limit
            except ValueError:
                return False
        if "chunked" not in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            return True
        body = request.read(limit + 1)
        if len(body) > limit:
            return False
        request._body = body  # what request.body and DRF's parsers read from now on
        request._stream = io.BytesIO(body)
        request.META["CONTENT_LENGTH"] = str(len(body))
        return True


class ApiNulMiddleware:
    """Refuses an API URL with a NUL character (in its path or a query value) with 400.

    PostgreSQL text can't hold NUL: a slug or filter carrying one would fail in the
    database as a 500 rather than be refused; SQLite would quietly match nothing. JSON
    bodies are checked by `console.api.parsers.JSONParser`."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        if request.path.startswith("/api/") and (
            "\x00" in request.path
            or any(
                "\x00" in key or any("\x00" in value for value in values)
                for key, values in request.GET.lists()
            )
        ):
            return json_error(400, "The URL contains a NUL character.", "invalid")
        return self.get_response(request)
