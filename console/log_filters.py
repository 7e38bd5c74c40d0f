"""Logging filters that keep the default log to what an operator acts on (settings.LOGGING)."""

from __future__ import annotations

import logging

from django.conf import settings


class ClientErrorsWithoutTraceback(logging.Filter):
    """Django logs a 4xx raised as an exception (PermissionDenied, Http404, a bad request)
    with its traceback: the client's mistake, not ours. The warning line stays; the
    traceback goes. 5xx keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        status_code = getattr(record, "status_code", None)
        if isinstance(status_code, int) and status_code < 500:
            record.exc_info = None
            record.exc_text = None
        return True


class NoStaticAccessLines(logging.Filter):
    """uvicorn's access log without the static files each page pulls (one line each)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn.access: (client, method, full path, HTTP version, status)
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            return not args[2].startswith(settings.STATIC_URL)
        return True
