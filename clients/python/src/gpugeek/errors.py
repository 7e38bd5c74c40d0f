"""Typed exceptions carrying the server's `detail`, `code` and field errors."""

from __future__ import annotations

from typing import Any


class GpuGeekError(Exception):
    """Any failure talking to the API."""

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        errors: dict[str, list[str]] | None = None,
        body: Any = None,
    ):
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.code = code
        self.errors = errors or {}
        self.body = body

    def __str__(self) -> str:
        text = self.detail
        if self.errors:
            fields = "; ".join(f"{k}: {' '.join(v)}" for k, v in self.errors.items())
            if fields not in text:
                text = f"{text} ({fields})" if text else fields
        return text


class UsageError(Exception):
    """The command line (or a spec file it reads) is wrong: the CLI's exit code 2."""


class APIError(GpuGeekError):
    """The server refused the request (an HTTP error status)."""


class ValidationError(APIError):
    """400: the request is invalid; `errors` maps fields to messages."""


class AuthenticationError(APIError):
    """401 or 403: no valid token, or the token may not do this."""


class NotFound(APIError):
    """404."""


class Conflict(APIError):
    """409: the object is not in a state that allows this."""


class QuotaExceeded(APIError):
    """A quota or capacity limit refused the request."""


class BudgetExceeded(APIError):
    """402 payment_required: a used-up budget refuses the launch (or the resume)."""


class ServerError(APIError):
    """5xx after the retries ran out."""


class ConnectionFailed(GpuGeekError):
    """The server could not be reached (after the retries ran out)."""


class Timeout(GpuGeekError):
    """A wait ran past its timeout."""


def _field_errors(body: dict) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    nested = body.get("errors")
    if isinstance(nested, dict):
        body = {**body, **nested}
    for key, value in body.items():
        if key in ("detail", "code", "errors"):
            continue
        if isinstance(value, list):
            errors[key] = [str(v) for v in value]
        elif isinstance(value, str):
            errors[key] = [value]
        elif isinstance(value, dict):
            errors[key] = [f"{k}: {v}" for k, v in value.items()]
    return errors


def error_for(status: int, body: Any) -> APIError:
    """The typed exception for an error response."""
    if isinstance(body, dict):
        detail = body.get("detail")
        code = body.get("code")
        errors = _field_errors(body)
    else:
        detail, code, errors = (str(body)[:500] if body else None), None, {}
    if isinstance(detail, list):
        detail = " ".join(str(d) for d in detail)
    if not detail:
        detail = "; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()) or f"HTTP {status}"
    code_text = str(code or "")
    cls: type[APIError]
    if status == 402 or code_text in ("payment_required", "budget_exceeded"):
        cls = BudgetExceeded
    elif "quota" in code_text:
        cls = QuotaExceeded
    elif status in (401, 403):
        cls = AuthenticationError
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 400 or status == 422:
        cls = ValidationError
    elif status >= 500:
        cls = ServerError
    else:
        cls = APIError
    return cls(str(detail), status=status, code=code, errors=errors, body=body)
