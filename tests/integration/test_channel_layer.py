"""The Channels layer is channels-redis on the real Redis, shared across processes."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers, get_channel_layer
from channels_redis.core import RedisChannelLayer

pytestmark = pytest.mark.integration


async def _group_round_trip() -> None:
    receiver_layer = get_channel_layer()
    assert isinstance(receiver_layer, RedisChannelLayer)
    # A second, independent layer (own connection pool), as another process would have:
    # a message can only get from one to the other through Redis.
    sender_layer = channel_layers.make_backend("default")
    group = f"job.test-{uuid.uuid4().hex}"
    member = await receiver_layer.new_channel()
    outsider = await receiver_layer.new_channel()
    try:
        await receiver_layer.group_add(group, member)
        await sender_layer.group_send(group, {"type": "job.status", "status": "running"})

        message = await asyncio.wait_for(receiver_layer.receive(member), timeout=5)
        assert message == {"type": "job.status", "status": "running"}
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(receiver_layer.receive(outsider), timeout=0.5)

        # After leaving the group, nothing more arrives.
        await receiver_layer.group_discard(group, member)
        await sender_layer.group_send(group, {"type": "job.status", "status": "done"})
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(receiver_layer.receive(member), timeout=0.5)
    finally:
        await receiver_layer.close_pools()
        await sender_layer.close_pools()


def test_group_send_reaches_group_members_through_redis():
    async_to_sync(_group_round_trip)()
