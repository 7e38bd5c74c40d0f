"""Reads that every request makes, kept in Django's cache and dropped when what they read
changes (Sentry's `get_from_cache`): the resolved API token, a user's memberships, the
bell's unread count.

`akept` is `kept` for code on an event loop (the services gateway): the same read through
redis.asyncio, with no hand-off to a worker thread.

The cache is a shortcut, never the truth. When Redis can't be reached, the read goes to
the database (signing in and the API keep working through a Redis restart), and a key
that could not be dropped lives at most its timeout.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import weakref
from collections.abc import Callable, Iterable
from typing import TypeVar

import redis.asyncio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, BaseCache, caches
from django.core.cache.backends.redis import RedisCache, RedisSerializer
from django.core.signals import setting_changed
from django.db import transaction
from django.dispatch import receiver
from redis.exceptions import RedisError

log = logging.getLogger(__name__)
T = TypeVar("T")
_MISSING = object()
_SERIALIZER = RedisSerializer()
# One redis.asyncio client per event loop: its connections belong to the loop that opened them.
_loop_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = (
    weakref.WeakKeyDictionary()
)


@functools.cache
def shared_cache() -> BaseCache:
    """Django's default cache, one per process. `django.core.cache.cache` is one per
    context, and under ASGI every request is a new context: each would open its own
    connection to Redis (1.1 ms more a request, measured). redis-py's connection pool is
    thread-safe, so the process shares one."""
    return caches.create_connection(DEFAULT_CACHE_ALIAS)


@receiver(setting_changed)
def _cache_settings_changed(*, setting: str, **kwargs) -> None:
    if setting == "CACHES":  # (tests)
        shared_cache.cache_clear()
        _loop_clients.clear()


def cached(key: str, timeout: int, read: Callable[[], T]) -> T:
    """The value kept under `key`, else `read()`, kept for `timeout` seconds unless it is
    None (nothing found is not kept: what is created a moment later is found at once)."""
    try:
        found = shared_cache().get(key, _MISSING)
    except RedisError as error:
        log.warning("cache unreachable, reading %s from the database: %s", key, error)
        return read()
    if found is not _MISSING:
        return found  # type: ignore[return-value]
    value = read()
    if value is None:
        return value
    try:
        shared_cache().set(key, value, timeout)
    except RedisError as error:
        log.warning("cache unreachable, %s not kept: %s", key, error)
    return value


def kept(keys: list[str]) -> dict[str, object]:
    """What is kept under `keys` (the ones found), in one read; nothing when Redis can't be
    reached (each is then read through `cached`)."""
    try:
        return shared_cache().get_many(keys)
    except RedisError as error:
        log.warning("cache unreachable, reading %s from the database: %s", keys, error)
        return {}


async def akept(keys: list[str]) -> dict[str, object]:
    """`kept`, read on the running event loop (no worker thread): the key made and the
    value read as the cache itself does. A cache other than Redis (tests) is read through
    `kept` in a worker thread."""
    store = shared_cache()
    if not isinstance(store, RedisCache):
        return await sync_to_async(kept, thread_sensitive=False)(keys)
    if not keys:
        return {}
    try:
        values = await _loop_client().mget([store.make_and_validate_key(key) for key in keys])
    except RedisError as error:
        log.warning("cache unreachable, reading %s from the database: %s", keys, error)
        return {}
    return {
        key: _SERIALIZER.loads(value)
        for key, value in zip(keys, values, strict=True)
        if value is not None
    }


def _loop_client() -> redis.asyncio.Redis:
    loop = asyncio.get_running_loop()
    client = _loop_clients.get(loop)
    if client is None:
        # A client's connections refer to their loop, so a closed loop's entry is dropped
        # here (the weak key alone would never let it go).
        for closed in [other for other in _loop_clients if other.is_closed()]:
            del _loop_clients[closed]
        config = settings.CACHES[DEFAULT_CACHE_ALIAS]
        location = config["LOCATION"]
        servers = re.split("[;,]", location) if isinstance(location, str) else location
        options = config.get("OPTIONS", {})
        timeouts = {
            name: options[name]
            for name in ("socket_connect_timeout", "socket_timeout")
            if name in options
        }
        # The first server is the one the cache writes and drops keys on: a drop (a
        # revoked token) is seen by the next read, with no replica's lag.
        pool = redis.asyncio.ConnectionPool.from_url(servers[0], **timeouts)
        client = _loop_clients[loop] = redis.asyncio.Redis(connection_pool=pool)
    return client


def forget(keys: Iterable[str]) -> None:
    """Drop `keys` now and again when the current transaction commits: a request that
    read the old rows before the commit may have kept them meanwhile."""
    keys = list(keys)
    if not keys:
        return
    _drop(keys)
    transaction.on_commit(lambda: _drop(keys))


def _drop(keys: list[str]) -> None:
    try:
        shared_cache().delete_many(keys)
    except RedisError as error:
        log.error("cache unreachable, %s kept until it times out: %s", keys, error)
