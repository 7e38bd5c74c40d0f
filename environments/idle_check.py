"""The staff-defined idleness check: one more activity source for the idle rule.

Where `ENVIRONMENT_IDLE_CHECK_URL` is set, the idle pass POSTs each running environment's
facts and the other sources' readings to that URL (a service the platform's staff run,
e.g. one that asks their license server or their own monitoring whether someone is
working there) and the answer counts like any other source:

    request:  {"organisation": "acme", "environment": "box", "job": 42,
               "interactive": "both", "gpus": 1, "running_since": "2026-…Z",
               "readings": [{"source": "ssh", "last_active_at": "…" | null,
                             "detail": "…"}, …]}
    answer:   {"active": true | false, "last_active_at": "…" (optional),
               "detail": "…" (optional, shown on the timeline)}

`active: true` is activity now; `active: false` is idle since `last_active_at` (not
before the start), else since the start. With `ENVIRONMENT_IDLE_CHECK_TOKEN` set, the
request carries `Authorization: Bearer <token>` so the service can tell the console's
calls. Anything else — no answer within `ENVIRONMENT_IDLE_CHECK_TIMEOUT`, an error
status, a body that isn't such an object — can't be read, so it counts as active: a
broken check never stops anyone's work. The job has no say in any of it: the console
asks the staff's service, never the job.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

import httpx
from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from environments.idle_rule import Activity
from environments.models import Environment

SOURCE = "staff check"
DETAIL_MAX = 200  # characters of the service's own words kept for the timeline


def is_configured() -> bool:
    return bool(settings.ENVIRONMENT_IDLE_CHECK_URL)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def request_body(
    environment: Environment, *, started: datetime, readings: Sequence[Activity]
) -> dict:
    return {
        "organisation": environment.tenant.slug,
        "environment": environment.name,
        "job": environment.current_job_id,
        "interactive": environment.interactive,
        "gpus": environment.gpus_per_node,
        "running_since": _iso(started),
        "readings": [
            {"source": a.source, "last_active_at": _iso(a.last_active_at), "detail": a.detail}
            for a in readings
        ],
    }


def _unreadable(why: str) -> Activity:
    return Activity(SOURCE, None, f"can't be read ({why}): counted as active")


def staff_check_activity(
    environment: Environment, *, started: datetime, now: datetime, readings: Sequence[Activity]
) -> Activity:
    """Ask the staff's service about a running environment; its answer as a reading."""
    headers = {"Accept": "application/json"}
    if settings.ENVIRONMENT_IDLE_CHECK_TOKEN:
        headers["Authorization"] = f"Bearer {settings.ENVIRONMENT_IDLE_CHECK_TOKEN}"
    body = request_body(environment, started=started, readings=readings)
    url: str = settings.ENVIRONMENT_IDLE_CHECK_URL or ""
    try:
        response = httpx.post(
            url,
            json=body,
            headers=headers,
            timeout=settings.ENVIRONMENT_IDLE_CHECK_TIMEOUT,
        )
    except httpx.TimeoutException:
        return _unreadable("no answer in time")
    except httpx.HTTPError as error:
        return _unreadable(type(error).__name__)
    if response.status_code != 200:
        return _unreadable(f"HTTP {response.status_code}")
    try:
        answer = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _unreadable("not JSON")
    if not isinstance(answer, dict) or not isinstance(answer.get("active"), bool):
        return _unreadable('no "active": true or false')
    said = answer.get("detail")
    words = f" — {said[:DETAIL_MAX]}" if isinstance(said, str) and said.strip() else ""
    if answer["active"]:
        return Activity(SOURCE, now, f"active{words}")
    last = answer.get("last_active_at")
    if last is None:
        return Activity(SOURCE, started, f"idle{words}")
    moment = parse_datetime(last) if isinstance(last, str) else None
    if moment is None or moment.tzinfo is None:
        return _unreadable("last_active_at isn't an ISO 8601 time with its offset")
    moment = min(max(moment, started), now)  # not before the start, not in the future
    return Activity(SOURCE, moment, f"idle since {timezone.localtime(moment):%H:%M:%S %Z}{words}")
