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


def logging_settings(level: str) -> dict:
    """settings.LOGGING: quiet by default, what an operator acts on, not a line per
    periodic task run, HTTP call or static file; `level` (LOG_LEVEL: INFO, DEBUG) opens
    the quiet loggers up to it."""
    quiet = level or "WARNING"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "filters": {
            "client_errors_without_traceback": {
                "()": "console.log_filters.ClientErrorsWithoutTraceback"
            },
            "no_static_access_lines": {"()": "console.log_filters.NoStaticAccessLines"},
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
        "root": {"handlers": ["console"], "level": level or "INFO"},
        "loggers": {
            "axes": {"level": "WARNING"},
            # One line per Prometheus query / API call.
            "httpx": {"level": quiet},
            "httpcore": {"level": quiet},
            # Celery's "Task … received" / "… succeeded in" and beat's "Sending due task":
            # periodic tasks (metrics every few seconds) would fill the log.
            "celery.worker.strategy": {"level": quiet},
            "celery.app.trace": {"level": quiet},
            "celery.beat": {"level": quiet},
            "django.request": {"filters": ["client_errors_without_traceback"]},
            "uvicorn.access": {"filters": [] if level == "DEBUG" else ["no_static_access_lines"]},
        },
    }
