"""Redis plumbing of log following: one asyncio client per event loop, and the lease
that makes exactly one process's follower read a job (SET NX PX, renewed, released by
its owner)."""

from __future__ import annotations

import asyncio
import contextlib
import weakref

from django.conf import settings

from console.queueing import broker_redis, redis_prefix

LEASE_SECONDS = 5.0
REDIS_TIMEOUT_SECONDS = 5.0


class RedisClients:
    """One asyncio Redis client per event loop (a client is bound to its loop)."""

    def __init__(self):
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self):
        import redis.asyncio as aioredis

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # Leases, hashes and scripts only (no blocking commands): an answer that takes
            # longer than this is a lost connection, never a reason to wait forever.
            client = aioredis.from_url(
                settings.REDIS_URL or "redis://127.0.0.1:1/0",
                socket_timeout=REDIS_TIMEOUT_SECONDS,
                socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
            )
            self._clients[loop] = client
        return client

    async def close(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.aclose(), REDIS_TIMEOUT_SECONDS)


redis_clients = RedisClients()


def lease_key(job_id: int) -> str:
    return f"{redis_prefix()}:logfollow:{job_id}:lease"


def followed(job_id: int) -> bool:
    """Whether some process's follower holds the job's lease (and so keeps its store
    current); False when Redis can't tell."""
    import redis

    try:
        return bool(broker_redis().exists(lease_key(job_id)))
    except redis.RedisError:
        return False


RELEASE_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
RENEW_SCRIPT = """
local current = redis.call('get', KEYS[1])
if current == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end
if not current then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""
