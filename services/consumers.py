"""The live socket of a replica's log (`/ws/services/<id>/replicas/<replica id>/logs/`):
for a member of the service's organisation (its current one, as the pages), the latest
lines at once, then each second the lines that are new and the replica's state, until
it has stopped. Access is checked again whenever the person's membership changes (the
jobs' sockets' AccessWatch); another organisation's replica is refused at the handshake
(4404, as a page's 404)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Literal, TypedDict

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from jobs.consumers import ACCESS_REVOKED, AccessWatch, current_membership
from jobs.realtime import parallel_db
from services import selectors
from services.logs import LogsUnavailable, lines_after, replica_log_lines
from services.models import ReplicaState, Service, ServiceReplica

log = logging.getLogger(__name__)

# Lines sent when the socket opens (the page shows as many).
FIRST_LINES = 500
FOLLOW_SECONDS = 1.0
NOT_FOUND = 4404


class ReplicaLogMessage(TypedDict):
    type: Literal["replica_log"]
    lines: list[str]  # new since the last message (the latest FIRST_LINES in the first)
    state: str
    reason: str
    error: str  # why the log can't be read now ("" when it was read)


def replica_log_message(replica: ServiceReplica, lines: list[str], error: str = "") -> dict:
    message: ReplicaLogMessage = {
        "type": "replica_log",
        "lines": lines,
        "state": replica.state,
        "reason": replica.reason,
        "error": error,
    }
    return dict(message)


@parallel_db
def _replica(membership, service_id: int, replica_id: int) -> ServiceReplica | None:
    service = Service.objects.for_tenant(membership.tenant).filter(pk=service_id).first()
    if service is None:
        return None
    replicas = selectors.service_replicas(service=service).select_related("service__pool")
    return replicas.filter(pk=replica_id).first()


@parallel_db
def _read(replica: ServiceReplica) -> tuple[ServiceReplica | None, list[str], str]:
    """The replica as it is now (None: gone) and its latest lines, or why they can't be
    read."""
    fresh = ServiceReplica.objects.select_related("service__pool").filter(pk=replica.pk).first()
    if fresh is None:
        return None, [], ""
    try:
        return fresh, replica_log_lines(fresh, tail=FIRST_LINES), ""
    except LogsUnavailable as unavailable:
        return fresh, [], f"The log can't be read now: {unavailable}"


class ReplicaLogConsumer(AsyncJsonWebsocketConsumer):
    channel_layer_alias = None  # (messages come from this socket's own reads)

    async def connect(self):
        self.access: AccessWatch | None = None
        self.follow: asyncio.Task | None = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=ACCESS_REVOKED)
            return
        membership = await current_membership(user, self.scope.get("session"))
        if membership is None:
            await self.close(code=ACCESS_REVOKED)
            return
        kwargs = self.scope["url_route"]["kwargs"]
        replica = await _replica(membership, kwargs["service_id"], kwargs["replica_id"])
        if replica is None:
            await self.close(code=NOT_FOUND)
            return
        self.access = AccessWatch(user, membership.tenant_id, self._revoke)
        if not await self.access.start():
            await self.close(code=ACCESS_REVOKED)
            return
        await self.accept()
        self.follow = asyncio.ensure_future(self._follow(replica))

    async def _follow(self, replica: ServiceReplica) -> None:
        sent: list[str] | None = None
        state = None
        try:
            while True:
                fresh, lines, error = await _read(replica)
                if fresh is None:  # (its row went: it stopped a while ago)
                    await self.close()
                    return
                new = lines if sent is None else lines_after(sent, lines)
                if sent is None or new or error or (fresh.state, fresh.reason) != state:
                    await self.send_json(replica_log_message(fresh, new, error))
                sent, state = (sent if error else lines), (fresh.state, fresh.reason)
                if fresh.state == ReplicaState.STOPPED:  # (what it said last is sent)
                    await self.close()
                    return
                await asyncio.sleep(FOLLOW_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as failure:  # usually the client went away mid-send
            log.warning("replica log socket stopped: %r", failure)

    async def receive_json(self, content, **kwargs):
        return  # nothing to ask for

    async def _revoke(self) -> None:
        await self.disconnect(ACCESS_REVOKED)
        await self.close(code=ACCESS_REVOKED)

    async def disconnect(self, code):
        follow, self.follow = self.follow, None
        if follow is not None and follow is not asyncio.current_task():
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follow
        if self.access is not None:
            await self.access.stop()
