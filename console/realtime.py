"""Live notice that a person's access to an organisation changed (removed, role changed).

Sockets are checked once at connect, so a member who is removed, or whose role drops
below what a socket needs, would keep watching until they reload. Each socket therefore
also joins `membership_group(tenant_id, user_id)`; the membership services publish a
`MembershipChangedMessage` there after commit, and the socket checks access again and
closes (4403) if it no longer qualifies.

The group and its publisher live here because console can't import jobs; the envelope is
the one every receiver in this project reads (jobs.realtime's GroupHub): a "relay" with
the group and the payload. Publishing never breaks the caller: a Redis outage loses the
notice (the socket keeps its connect-time check until it reconnects), never the change.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

MEMBERSHIP_CHANGED = "membership_changed"


class MembershipChangedMessage(TypedDict):
    type: str  # MEMBERSHIP_CHANGED
    tenant_id: int
    user_id: int


def membership_group(tenant_id: int, user_id: int) -> str:
    """The group of one person's sockets on one organisation's pages."""
    return f"membership.{tenant_id}.{user_id}"


def relay_envelope(group: str, payload: dict) -> dict:
    """What a channel layer carries to a process's hub: the group and the payload."""
    return {"type": "relay", "group": group, "payload": payload}


def send_to_group(group: str, payload: dict) -> None:
    """Send now (sync code), logging instead of raising when the layer is unreachable."""
    send_to_groups([group], payload)


def send_to_groups(groups: list[str], payload: dict) -> None:
    """`send_to_group` to several groups in one hop from sync to async code (each hop
    costs more than a send)."""
    try:
        layer = get_channel_layer()
        if layer is None:
            return

        async def send_all() -> None:
            for group in groups:
                await layer.group_send(group, relay_envelope(group, dict(payload)))

        send = async_to_sync(send_all)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            send()
        else:
            # Sync code running in an event loop's thread: send from a helper thread.
            with ThreadPoolExecutor(1) as helper:
                helper.submit(send).result(timeout=10)
    except Exception:
        log.warning("realtime publish to %s failed", ", ".join(groups), exc_info=True)


def publish_membership_changed(*, tenant_id: int, user_id: int) -> None:
    """After the current transaction commits, tell the person's open sockets on this
    organisation to check their access again."""
    message = MembershipChangedMessage(
        type=MEMBERSHIP_CHANGED, tenant_id=tenant_id, user_id=user_id
    )
    group = membership_group(tenant_id, user_id)
    transaction.on_commit(lambda: send_to_group(group, dict(message)))
