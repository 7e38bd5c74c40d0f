"""Quiet logs by default (settings.LOGGING, console/log_filters.py) and the sign-in of an
account that awaits verification, which is no failed sign-in."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from axes.models import AccessAttempt, AccessFailureLog
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse

from console.celery import app as celery_app
from console.log_filters import NoStaticAccessLines
from tests.factories import UserFactory

LOGIN = reverse("login")
QUIET_LOGGERS = [
    "httpx",
    "httpcore",
    "celery.worker.strategy",
    "celery.app.trace",
    "celery.beat",
]


def sign_in(email: str, password: str, ip: str = "192.0.2.7"):
    return Client().post(LOGIN, {"username": email, "password": password}, REMOTE_ADDR=ip)


def logger_levels(log_level: str | None) -> dict[str, int]:
    """The effective levels a fresh process gets from settings.LOGGING."""
    env = {k: v for k, v in os.environ.items() if k != "LOG_LEVEL"}
    if log_level:
        env["LOG_LEVEL"] = log_level
    names = [*QUIET_LOGGERS, "console"]
    script = (
        "import django, json, logging; django.setup(); "
        f"print(json.dumps({{n: logging.getLogger(n).getEffectiveLevel() for n in {names!r}}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_noisy_loggers_are_quiet_by_default_and_log_level_opens_them():
    quiet = logger_levels(None)
    assert all(quiet[name] == logging.WARNING for name in QUIET_LOGGERS), quiet
    assert quiet["console"] == logging.INFO  # our own INFO lines stay

    opened = logger_levels("DEBUG")
    assert all(opened[name] == logging.DEBUG for name in QUIET_LOGGERS), opened


def test_worker_logs_printed_mail_at_info_not_warning():
    assert celery_app.conf.worker_redirect_stdouts_level == "INFO"


def access_record(path: str) -> logging.LogRecord:
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", path, "1.1", 200), None,
    )  # fmt: skip


def test_static_files_stay_out_of_the_access_log():
    access = logging.getLogger("uvicorn.access")
    assert any(isinstance(f, NoStaticAccessLines) for f in access.filters)
    assert not access.filters[0].filter(access_record(f"{settings.STATIC_URL}js/app.1a2b.js"))
    assert access.filters[0].filter(access_record("/jobs/12/"))


@pytest.mark.django_db
def test_a_client_error_is_one_line_without_traceback(client, caplog):
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client.get("/no-such-page/")
    assert response.status_code == 404
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.status_code == 404
    assert record.exc_info is None
    assert "Traceback" not in caplog.text


def test_a_server_error_keeps_its_traceback():
    request_logger = logging.getLogger("django.request")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = request_logger.makeRecord(
            "django.request", logging.ERROR, __file__, 1, "Internal Server Error", (),
            sys.exc_info(), extra={"status_code": 500},
        )  # fmt: skip
    assert all(f.filter(record) for f in request_logger.filters)
    assert record.exc_info is not None


# --- sign-in of an account awaiting verification ----


@pytest.fixture
def unverified(db, password):
    return UserFactory(email="new@example.test", is_active=False)


@override_settings(AXES_FAILURE_LIMIT=3)
def test_right_password_of_an_unverified_account_is_no_failure(unverified, password, caplog):
    with caplog.at_level(logging.INFO):
        answers = [sign_in(unverified.email, password) for _ in range(5)]

    assert [a.status_code for a in answers] == [200] * 5  # never 429: not counted
    assert all("Verify your e-mail address first" in a.content.decode() for a in answers)
    assert not AccessAttempt.objects.exists()
    assert not AccessFailureLog.objects.exists()
    assert not [r for r in caplog.records if r.name.startswith("axes")]


@override_settings(AXES_FAILURE_LIMIT=3)
def test_wrong_passwords_of_an_unverified_account_count_toward_lockout(unverified, password):
    wrong = [sign_in(unverified.email, "not-it") for _ in range(3)]
    assert AccessAttempt.objects.get().failures_since_start == 3
    locked = sign_in(unverified.email, password)

    assert [a.status_code for a in wrong] == [200, 200, 429]
    assert "Verify your e-mail" not in wrong[0].content.decode()  # no hint without it
    # Locked out: the right password says nothing about the account either.
    assert locked.status_code == 429
    assert "Verify your e-mail" not in locked.content.decode()


def token_login(email: str, password: str, ip: str = "192.0.2.7"):
    """The SDK/CLI login: credentials for an API token (POST /api/v1/auth/token)."""
    return Client().post(
        reverse("api-auth-token"),
        {"email": email, "password": password, "name": "cli"},
        content_type="application/json",
        REMOTE_ADDR=ip,
    )


@override_settings(AXES_FAILURE_LIMIT=3)
def test_token_login_with_the_right_password_of_an_unverified_account_is_no_failure(
    unverified, password, caplog
):
    with caplog.at_level(logging.INFO):
        answers = [token_login(unverified.email, password) for _ in range(5)]

    assert [a.status_code for a in answers] == [403] * 5  # never 429: not counted
    assert all("Verify your e-mail address first" in a.json()["detail"] for a in answers)
    assert not AccessAttempt.objects.exists()
    assert not AccessFailureLog.objects.exists()
    assert not [r for r in caplog.records if r.name.startswith("axes")]
    assert not unverified.api_tokens.exists()


@override_settings(AXES_FAILURE_LIMIT=3)
def test_token_login_wrong_passwords_of_an_unverified_account_count_toward_lockout(
    unverified, password
):
    wrong = [token_login(unverified.email, "not-it") for _ in range(3)]
    assert AccessAttempt.objects.get().failures_since_start == 3
    locked = token_login(unverified.email, password)

    assert [a.status_code for a in wrong] == [401, 401, 429]
    assert "Verify" not in wrong[0].json()["detail"]  # no hint without the password
    assert locked.status_code == 429  # locked out: the right password reveals nothing
    assert "Verify" not in locked.content.decode()
