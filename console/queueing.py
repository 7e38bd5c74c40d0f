"""The one way to queue a Celery task from a service: the task object, after commit.

Services import their app's task module as a module (`from jobs import tasks`) and the
task modules import services the same way, so the cycle resolves at call time and
"find usages" finds every sender. A broker outage at commit must not fail the request
whose transaction already committed: it is logged, and the periodic reconcilers redo
the work from the database rows, which are the truth.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)
_clients: dict[str, Any] = {}


def enqueue_now(task: Task, *args: Any, countdown: float | None = None) -> bool:
    """Send `task` now (to run in `countdown` seconds, if given); False when the broker
    can't take it."""
    try:
        task.apply_async(args=args, countdown=countdown)
    except Exception:
        log.exception("could not queue %s%r; a reconciler will redo it", task.name, args)
        return False
    return True


def enqueue_on_commit(task: Task, *args: Any) -> None:
    """Send `task` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: enqueue_now(task, *args))


def redis_prefix() -> str:
    """What the console's own keys in Redis start with (the channel layer's prefix), so
    that consoles sharing one Redis never meet."""
    layer: dict[str, Any] = settings.CHANNEL_LAYERS["default"]
    return str(layer.get("CONFIG", {}).get("prefix", "gpugeek"))


def broker_redis():
    """A client of the Redis the broker runs on (REDIS_URL), kept per process, for
    the log followers' leases. Short timeouts: an answer that takes seconds is a lost
    connection."""
    import redis

    url = settings.REDIS_URL or "redis://127.0.0.1:1/0"
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(
            url, socket_connect_timeout=0.5, socket_timeout=5
        )
    return client
