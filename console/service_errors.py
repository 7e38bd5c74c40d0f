"""The refusal every service raises, and the closed set of reasons it may give.

Views turn a `ServiceError` into a form error (`console.forms.add_service_error`), the
API into its error envelope with the status its `ErrorCode` carries; so a new reason is
one enum member here, never a string a caller has to spell the same way twice.
"""

from __future__ import annotations

from enum import StrEnum
from http import HTTPStatus


class ErrorCode(StrEnum):
    """Why a service refused, as the API's machine-readable `code`."""

    INVALID = "invalid"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    PAYMENT_REQUIRED = "payment_required"

    @property
    def http_status(self) -> HTTPStatus:
        return _HTTP_STATUS[self]


_HTTP_STATUS = {
    ErrorCode.INVALID: HTTPStatus.BAD_REQUEST,
    ErrorCode.FORBIDDEN: HTTPStatus.FORBIDDEN,
    ErrorCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.CONFLICT: HTTPStatus.CONFLICT,
    ErrorCode.PAYMENT_REQUIRED: HTTPStatus.PAYMENT_REQUIRED,
}


class ServiceError(Exception):
    """A refused request, with a message fit to show the user and, where one input is
    to blame, the name of its form field."""

    def __init__(
        self, message: str, *, code: ErrorCode = ErrorCode.INVALID, field: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.code = ErrorCode(code)  # a stray string fails here, not as a 400 later
        self.field = field
