"""The one sender to channel groups: what every publisher (jobs.realtime.publish) uses,
from sync code (services, tasks, the watcher) and from the event loop (log followers).

Sending never breaks the caller: a Redis outage loses a live update (the page catches up
on reconnect), never a state change. Every message travels in the envelope each process's
hub (jobs.realtime.hub) reads: a "relay" with the group and the payload, or for a batch
one "relay_many" to every hub at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import channel_layers, get_channel_layer

log = logging.getLogger(__name__)

# Every process's hub joins this group. A batch (e.g. 100 jobs dispatched together, two
# groups each) goes there as one "relay_many" envelope, each hub handing each payload to
# its own subscribers of its groups: one Redis send instead of one per job and group
# (two round trips each, even for a group nobody watches).
BROADCAST_GROUP = "relay.broadcast"
BROADCAST_FROM = 8  # messages in one send_many; fewer go group by group
BROADCAST_CHUNK = 100  # messages per envelope, so that none grows large

Payload = Mapping[str, Any]  # one of jobs.realtime.messages' payloads


def relay_envelope(group: str, payload: Payload) -> dict:
    """What a channel layer carries to a process's hub: the group and the payload."""
    return {"type": "relay", "group": group, "payload": dict(payload)}


def relay_many_envelope(messages: list[tuple[list[str], Payload]]) -> dict:
    return {
        "type": "relay_many",
        "messages": [{"groups": list(groups), "payload": dict(p)} for groups, p in messages],
    }


def send_to_group(group: str, payload: Payload) -> None:
    """Send now (sync code), logging instead of raising when the layer is unreachable."""
    send_to_groups([group], payload)


def send_to_groups(groups: list[str], payload: Payload) -> None:
    """`send_to_group` to several groups in one hop from sync to async code."""
    send_many([(groups, payload)])


def send_many(messages: list[tuple[list[str], Payload]]) -> None:
    """Send each payload to its groups, all in one hop from sync to async code (a batch
    of status changes costs one hop, not one each)."""
    try:
        publisher = _publisher()
        if publisher is None:
            return
        loop, layer = publisher

        async def send_all() -> None:
            if len(messages) >= BROADCAST_FROM:
                for start in range(0, len(messages), BROADCAST_CHUNK):
                    envelope = relay_many_envelope(messages[start : start + BROADCAST_CHUNK])
                    await layer.group_send(BROADCAST_GROUP, envelope)
                return
            for groups, payload in messages:
                for group in groups:
                    await layer.group_send(group, relay_envelope(group, payload))

        asyncio.run_coroutine_threadsafe(send_all(), loop).result(timeout=10)
    except Exception:
        groups = sorted({group for groups, _ in messages for group in groups})
        log.warning("realtime publish to %s failed", ", ".join(groups[:10]), exc_info=True)


async def asend_to_group(group: str, payload: Payload) -> None:
    """`send_to_group` from the event loop (the configured layer, on this loop)."""
    try:
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(group, relay_envelope(group, payload))
    except Exception:
        log.warning("realtime publish to %s failed", group, exc_info=True)


# The process's publishing loop: (pid, the configured layer it follows, loop, own layer).
_publishing: tuple[int, object, asyncio.AbstractEventLoop, object] | None = None
_publishing_lock = threading.Lock()


def _publisher() -> tuple[asyncio.AbstractEventLoop, Any] | None:
    """An event loop in its own thread, kept for the process, and a channel layer of
    its own on it. Sync code publishes through it: `async_to_sync` would start a thread,
    an event loop and a Redis connection for every send (see docs/architecture.md for
    the figures). The layer is its own instance so that closing the shared layer's pools
    from another loop (tests, shutdown) never touches this loop's; a new one is made when
    the configured layer is replaced (settings changed) or after a fork (the thread
    doesn't survive one)."""
    global _publishing
    configured = get_channel_layer()
    if configured is None:
        return None
    with _publishing_lock:
        if _publishing is not None and _publishing[:2] == (os.getpid(), configured):
            return _publishing[2], _publishing[3]
        if _publishing is not None and _publishing[0] == os.getpid():
            _publishing[2].call_soon_threadsafe(_publishing[2].stop)  # the replaced one
        loop = asyncio.new_event_loop()
        threading.Thread(target=_run_forever, args=(loop,), name="realtime", daemon=True).start()
        own = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        _publishing = (os.getpid(), configured, loop, own)
        return loop, own


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()
