"""JSON errors for the API: every refusal has a body that says why."""

from __future__ import annotations

from django.http import JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from console.service_errors import ErrorCode, ServiceError


def error_body(detail: str, code: str, fields: dict | None = None) -> dict:
    """The one error envelope of the API: `detail` (a sentence), `code` (a machine word)
    and, for invalid input, each field's messages under the field's name."""
    return {**(fields or {}), "detail": detail, "code": code}


def error_response(status_code: int, detail: str, code: str) -> Response:
    """A refusal a view answers itself (not raised), in the same envelope."""
    return Response(error_body(detail, code), status=status_code)


def json_error(status_code: int, detail: str, code: str) -> JsonResponse:
    """The envelope outside DRF (Django's error handlers, middleware under /api/)."""
    return JsonResponse(error_body(detail, code), status=status_code)


def _first_message(errors) -> str:
    """The first message of a (possibly nested) DRF error structure."""
    if isinstance(errors, dict):
        for key, value in errors.items():
            message = _first_message(value)
            if message:
                return message if key == api_settings.NON_FIELD_ERRORS_KEY else f"{key}: {message}"
        return ""
    if isinstance(errors, list):
        return next((m for m in map(_first_message, errors) if m), "")
    return str(errors)


def _validation_body(exc: exceptions.ValidationError) -> dict:
    detail = exc.detail
    if isinstance(detail, dict):
        return error_body(
            _first_message(detail) or "Invalid input.", ErrorCode.INVALID, dict(detail)
        )
    return error_body(_first_message(detail) or "Invalid input.", ErrorCode.INVALID)


def exception_handler(exc, context):
    """DRF's handler (status, headers, Http404 and PermissionDenied mapped), then every
    body rewritten into the envelope, so clients parse one shape whatever refused them."""
    if isinstance(exc, ServiceError):
        fields = {exc.field: [exc.message]} if exc.field else None
        return Response(
            error_body(exc.message, exc.code, fields),
            status=exc.code.http_status,
        )
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = _validation_body(exc)
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else exc.default_code
        response.data = error_body(_first_message(exc.detail), str(code))
    else:  # Http404 and Django's PermissionDenied, which DRF turned into its own
        code = "not_found" if response.status_code == 404 else "permission_denied"
        response.data = error_body(_first_message(response.data.get("detail", "")), code)
    return response
