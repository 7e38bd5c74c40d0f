"""Patches of third-party libraries, each applied explicitly by the entry point that
needs it (never from an AppConfig.ready()), with its upstream issue and when to remove it.

Daphne's HTTP flow control (`patch_daphne_flow_control`, applied by console/asgi.py).
Daphne answers the ASGI `send` of an `http.response.body` by writing it into Twisted's
transport buffer and returning at once: it registers no Twisted producer, so a streaming
response runs as fast as the application produces it, whatever the client reads, and a
client that stops reading leaves the rest of the response in the web process. Measured
on a 128 MiB job log with a client reading nothing (tests/integration/
test_stream_backpressure.py): the download grew Daphne by 133 MiB and the NDJSON log
stream by 136 MiB, never given back; with the patch, by 1–5 MiB. `send` now returns once
the transport can take more, as uvicorn's does (its `FlowControl.drain`), so a stream's
generator goes at its client's pace.
Upstream: https://github.com/django/daphne/issues/170 (the same missing producer, for
WebSockets; open). Remove this patch once Daphne waits for the transport itself
(daphne.server.Server.handle_reply or daphne.http_protocol.WebRequest registering a
producer): the test above then passes without it.

WebSockets are left as they are: a job socket's sends are made from the realtime hub's
fan-out (jobs.realtime.GroupHub), where one slow socket waiting would hold up the others.
"""

from __future__ import annotations

import asyncio

from daphne.server import Server
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer


@implementer(IPushProducer)
class _ResponseFlow:
    """A push producer registered on one Twisted request while its body streams: Twisted
    pauses it when the transport's buffer passes its high-water mark (64 KiB) and
    resumes it once the buffer has drained; `writable` tells the sender which."""

    def __init__(self, paused: bool) -> None:
        self.writable = asyncio.Event()
        if not paused:
            self.writable.set()

    def pauseProducing(self) -> None:  # Twisted's IPushProducer
        self.writable.clear()

    def resumeProducing(self) -> None:
        self.writable.set()

    def stopProducing(self) -> None:  # the connection is gone: wait no more
        self.writable.set()


_FLOW_ATTRIBUTE = "_gpugeek_response_flow"


def _flow_for(request) -> _ResponseFlow | None:
    """The request's producer, registered on its first streamed body chunk; None once the
    request has finished or lost its connection (nothing left to wait for)."""
    flow = getattr(request, _FLOW_ATTRIBUTE, None)
    if flow is None:
        channel = getattr(request, "channel", None)
        if channel is None or getattr(request, "finished", False):
            return None
        # A transport already over its mark (an earlier response of the connection)
        # sends no pause to a producer registered later.
        flow = _ResponseFlow(paused=getattr(channel, "_waitingForTransport", False))
        request.registerProducer(flow, True)
        setattr(request, _FLOW_ATTRIBUTE, flow)
        # The connection dropping ends the wait too (Deferred errback consumed here).
        request.notifyFinish().addBoth(lambda _: flow.writable.set())
    return flow


def _flow_done(request) -> None:
    """Unregister the request's producer before its last chunk: the channel would refuse
    the next request's producer on a kept-alive connection."""
    flow = getattr(request, _FLOW_ATTRIBUTE, None)
    if flow is None:
        return
    setattr(request, _FLOW_ATTRIBUTE, None)
    if getattr(request, "channel", None) is not None and request.producer is flow:
        request.unregisterProducer()


def patch_daphne_flow_control() -> None:
    """Make Daphne's `send` of a streamed HTTP body chunk wait until the client's
    connection can take more (see the module's docstring). Idempotent."""
    if getattr(Server.handle_reply, "flow_controlled", False):
        return
    original = Server.handle_reply

    async def handle_reply(self, protocol, message):
        if message.get("type") != "http.response.body":
            return await original(self, protocol, message)
        if not message.get("more_body", False):
            _flow_done(protocol)
            return await original(self, protocol, message)
        await original(self, protocol, message)
        flow = _flow_for(protocol)
        if flow is not None:
            await flow.writable.wait()

    handle_reply.flow_controlled = True  # type: ignore[attr-defined]
    Server.handle_reply = handle_reply  # type: ignore[method-assign]
