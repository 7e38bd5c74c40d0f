"""GET /healthz: can the web process reach its database and Redis, and are the
background components alive? 503 when the database or Redis fails.

Anonymous callers (load balancers, uptime checks) get `{"status": ...}` and the HTTP code
only: the details (hosts, pids, error texts, heartbeats) map the installation for an
attacker. Staff sessions and `Authorization: Bearer <HEALTHZ_TOKEN>` get them."""

from __future__ import annotations

import hmac

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache

from console.host_access import host_isolation
from console.selectors import heartbeat_status


def _check_database() -> dict:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as error:
        return {"status": "error", "error": f"{type(error).__name__}: {error}"[:300]}
    return {"status": "ok", "vendor": connection.vendor}


def _check_redis() -> dict:
    if not settings.REDIS_URL:
        return {
            "status": "error",
            "error": "REDIS_URL is not set and the embedded Redis is not running "
            "(start the console with `manage.py runconsole`).",
        }
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2
        )
        client.ping()
        client.close()
    except Exception as error:
        return {"status": "error", "error": f"{type(error).__name__}: {error}"[:300]}
    return {"status": "ok"}


def _may_see_details(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return True
    token = settings.HEALTHZ_TOKEN
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    return bool(
        token
        and scheme.lower() == "bearer"
        and hmac.compare_digest(presented.strip().encode(), token.encode())
    )


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    components: dict = {"database": _check_database(), "redis": _check_redis()}
    if components["database"]["status"] == "ok":
        components.update(heartbeat_status())
    isolation = host_isolation()
    if isolation is not None:  # for staff: host jobs unsandboxed is a state, not an outage
        components["host_sandbox"] = {
            "status": "ok" if isolation.isolated else "degraded",
            "note": isolation.note,
        }
    failing = [name for name in ("database", "redis") if components[name]["status"] != "ok"]
    body: dict = {"status": "ok" if not failing else "error"}
    if _may_see_details(request):
        body["components"] = components
        if failing:
            body["failing"] = failing
    return JsonResponse(body, status=503 if failing else 200)


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """GET /readyz: may this web process take traffic? Its database and Redis answer.
    (The background components' heartbeats, which /healthz reports, don't decide it:
    a stopped worker must not take the web pods out of their Service.)"""
    failing = [
        name
        for name, check in (("database", _check_database), ("redis", _check_redis))
        if check()["status"] != "ok"
    ]
    body: dict = {"status": "ok" if not failing else "error"}
    if failing and _may_see_details(request):
        body["failing"] = failing
    return JsonResponse(body, status=503 if failing else 200)
