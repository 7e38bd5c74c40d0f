"""Receiving: one `GroupHub` per ASGI process (per event loop).

The hub is the only member of each group in its process and fans every message out in
memory to the sockets of that process that subscribed. With 1,000 sockets on 100 jobs a
log batch crosses Redis once per process instead of once per socket (10× fewer Redis
messages in the benchmark's case), and the per-socket cost is an in-memory queue put.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from jobs.realtime.sender import BROADCAST_GROUP

log = logging.getLogger(__name__)


def parallel_db(function):
    """`function` (it reads the database) for the event loop: run in a worker thread of
    its own, not asgiref's one thread-sensitive thread, so many sockets read in parallel,
    and with the connection closed (or its pool slot given back) after each call, which
    asgiref's sync_to_async never does: one kept open on a long-lived thread holds a pool
    slot and is never checked after a database restart."""
    return database_sync_to_async(function, thread_sensitive=False)


# --- receiving: one hub per process -------------------------------------------------------

# Called with each message of a group. It must not wait (a socket puts the message on its
# own queue): the hub serves every socket of the process, and one slow client's sends
# (the server holds them until its connection drains) must not hold up the others.
Subscriber = Callable[[dict], None]
# Delivered to every subscriber when the hub may have missed messages: catch up from the
# database and the log store (never sent to browsers as is).
RESYNC = "_resync"


class GroupHub:
    """Joins channel groups on behalf of this process's sockets and fans messages out.

    A subscriber is a plain callable taking the payload dict (a consumer puts it on its
    own queue, so its sends stay ordered, and sends from its own task). The hub re-adds
    its memberships periodically, so a Redis restart (which forgets groups) heals without
    reconnecting every socket.
    """

    REFRESH_SECONDS = 30.0

    def __init__(self, layer):
        self.layer = layer
        self.channel: str | None = None
        self.subscribers: dict[str, set[Subscriber]] = {}
        self._ready = asyncio.Lock()
        self._reader: asyncio.Task | None = None
        self._refresher: asyncio.Task | None = None
        self._closing = False

    async def _start(self) -> None:
        async with self._ready:
            if self.channel is None:
                # The default prefix: channels-redis receives all of a process's
                # "specific." channels through one Redis list; another prefix would make a
                # second list, and receivers on both would take turns (seconds of delay).
                self.channel = await self.layer.new_channel()
                self._reader = asyncio.ensure_future(self._read())
                self._refresher = asyncio.ensure_future(self._refresh())
                try:
                    await self.layer.group_add(BROADCAST_GROUP, self.channel)
                except Exception as error:
                    # Started all the same: the refresher joins it again.
                    log.warning("realtime hub could not join %s (%s)", BROADCAST_GROUP, error)

    async def subscribe(self, group: str, subscriber: Subscriber) -> None:
        await self._start()
        first = group not in self.subscribers
        self.subscribers.setdefault(group, set()).add(subscriber)
        if first:
            await self.layer.group_add(group, self.channel)

    async def unsubscribe(self, group: str, subscriber: Subscriber) -> None:
        members = self.subscribers.get(group)
        if not members:
            return
        members.discard(subscriber)
        if not members:
            del self.subscribers[group]
            with contextlib.suppress(Exception):
                await self.layer.group_discard(group, self.channel)

    def deliver_local(self, group: str, payload: dict) -> None:
        """Hand `payload` to this process's subscribers of `group` without Redis (a
        publisher that knows no other process has subscribers)."""
        for subscriber in list(self.subscribers.get(group, ())):
            self._deliver(subscriber, payload)

    def local_count(self, group: str) -> int:
        return len(self.subscribers.get(group, ()))

    async def _read(self) -> None:
        while not self._closing:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if self._closing:
                    return
                # A failed read may have lost a message (or Redis restarted and forgot
                # our groups): rejoin, and tell every socket to catch up from the truth.
                log.warning("realtime hub receive failed (%s); resyncing", error)
                await asyncio.sleep(0.5)
                for group in [BROADCAST_GROUP, *self.subscribers]:
                    with contextlib.suppress(Exception):
                        await self.layer.group_add(group, self.channel)
                self._fan_out_all({"type": RESYNC})
                continue
            if message.get("type") == "relay_many":
                for entry in message.get("messages") or []:
                    for group in entry.get("groups") or []:
                        if group in self.subscribers:
                            self.deliver_local(group, dict(entry.get("payload") or {}))
                continue
            group, payload = message.get("group"), message.get("payload")
            if not group or payload is None:
                continue
            self.deliver_local(group, payload)

    def _fan_out_all(self, payload: dict) -> None:
        delivered: set = set()
        for members in list(self.subscribers.values()):
            for subscriber in list(members):
                if subscriber not in delivered:
                    delivered.add(subscriber)
                    self._deliver(subscriber, payload)

    @staticmethod
    def _deliver(subscriber: Subscriber, payload: dict) -> None:
        try:
            subscriber(payload)
        except Exception:
            log.warning("realtime subscriber failed", exc_info=True)

    async def close(self) -> None:
        self._closing = True
        tasks = {task for task in (self._reader, self._refresher) if task is not None}
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded, like every shutdown step: a read stuck in Redis must not hang it.
            await asyncio.wait(tasks, timeout=5.0)
        self.subscribers.clear()
        self.channel = None

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self.REFRESH_SECONDS)
            for group in [BROADCAST_GROUP, *self.subscribers]:
                with contextlib.suppress(Exception):
                    await self.layer.group_add(group, self.channel)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupHub] = weakref.WeakKeyDictionary()


def _receiving_layer():
    """The channel layer the hub receives with: the configured one, except that a
    channels-redis layer gets a socket timeout above its blocking pop's (redis-py 8 sets
    both to 5 s, so an idle receive would fail every 5 s and the hub would resync every
    socket). Same Redis, same prefix: any process's group_send reaches it."""
    from django.conf import settings

    layer = get_channel_layer()
    config = settings.CHANNEL_LAYERS.get("default", {})
    if config.get("BACKEND") != "channels_redis.core.RedisChannelLayer":
        return layer
    options = dict(config.get("CONFIG", {}))
    hosts = []
    for host in options.get("hosts", []):
        host = {"address": host} if isinstance(host, str) else dict(host)
        if (host.get("socket_timeout") or 0) <= layer.brpop_timeout:
            host["socket_timeout"] = layer.brpop_timeout * 6
        hosts.append(host)
    options["hosts"] = hosts
    return type(layer)(**options)


def hub() -> GroupHub:
    """This event loop's hub (a server process has one loop; tests may run several, one at
    a time)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = GroupHub(_receiving_layer())
    return found


async def close_hub() -> None:
    """Stop this loop's hub and close its Redis pools (tests, shutdown)."""
    found = _hubs.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.close()
        if hasattr(found.layer, "close_pools"):
            await found.layer.close_pools()
    layer = get_channel_layer()
    if layer is not None and hasattr(layer, "close_pools"):
        await layer.close_pools()
