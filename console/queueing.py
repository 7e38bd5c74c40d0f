"""The one way to queue a Celery task from a service: after commit, by name.

Queuing by name keeps services free of imports of task modules (tasks import services,
not the other way round). A broker outage at commit must not fail the request whose
transaction already committed: it is logged, and the periodic reconcilers redo the work
from the database rows, which are the truth.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)
_clients: dict[str, Any] = {}


def enqueue_now(task_name: str, *args: Any) -> bool:
    """Send `task_name` (its dotted name) now; False when the broker can't take it.

    By name (`send_task`): the sending process needn't have imported the task's module;
    the worker, which registers every task, runs it with the task's own options."""
    try:
        current_app.send_task(task_name, args=args)
    except Exception:
        log.exception("could not queue %s%r; a reconciler will redo it", task_name, args)
        return False
    return True


def enqueue_on_commit(task_name: str, *args: Any) -> None:
    """Send `task_name` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: enqueue_now(task_name, *args))


def redis_prefix() -> str:
    """What the console's own keys in Redis start with (the channel layer's prefix), so
    that consoles sharing one Redis never meet."""
    layer: dict[str, Any] = settings.CHANNEL_LAYERS["default"]
    return str(layer.get("CONFIG", {}).get("prefix", "gpugeek"))


def broker_redis():
    """A client of the Redis the broker runs on (REDIS_URL), kept per process, for
    hand-offs that ride beside the task queue. Short timeouts: an answer that takes
    seconds is a lost connection."""
    import redis

    url = settings.REDIS_URL or "redis://127.0.0.1:1/0"
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(
            url, socket_connect_timeout=0.5, socket_timeout=5
        )
    return client
