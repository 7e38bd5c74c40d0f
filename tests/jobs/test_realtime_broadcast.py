"""A batch of status changes reaches a process's hub as one broadcast envelope, and the
hub hands each payload to its own subscribers of the payload's groups only, in order."""

from __future__ import annotations

import asyncio
import uuid

from asgiref.sync import async_to_sync
from channels.layers import channel_layers

from jobs.realtime import GroupHub, sender


def delivered_through_a_hub(watched: list[str], messages: list[tuple[list[str], dict]]):
    """A hub (its own layer, as an ASGI process has) subscribed to `watched`; the sync
    publisher sends `messages` in one send_many; returns (group, payload) as delivered,
    and the number of group sends the publisher made."""

    async def round_trip() -> list[tuple[str, dict]]:
        hub = GroupHub(channel_layers.make_backend("default"))
        got: list[tuple[str, dict]] = []
        expected = sum(1 for groups, _ in messages for group in groups if group in watched)
        for group in watched:
            await hub.subscribe(group, lambda payload, group=group: got.append((group, payload)))
        try:
            await asyncio.to_thread(sender.send_many, messages)
            for _ in range(100):
                if len(got) >= expected:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.1)  # nothing more may come
            return got
        finally:
            await hub.close()
            await hub.layer.close_pools()

    return async_to_sync(round_trip)()


def counted_group_sends(monkeypatch) -> list[str]:
    """The groups the publisher's own layer sends to (it is made on first use)."""
    sent: list[str] = []
    _, layer = sender._publisher()
    original = layer.group_send

    async def counting(group, message):
        sent.append(group)
        await original(group, message)

    monkeypatch.setattr(layer, "group_send", counting)
    return sent


def test_a_batch_goes_out_as_one_broadcast_and_reaches_only_the_watched_groups(monkeypatch):
    tag = uuid.uuid4().hex
    watched_job, watched_tenant = f"job.{tag}-1", f"tenant.{tag}"
    messages = [
        ([f"job.{tag}-{n}", watched_tenant], {"job_id": n, "status": "provisioning"})
        for n in range(1, 21)
    ]
    sent = counted_group_sends(monkeypatch)

    got = delivered_through_a_hub([watched_job, watched_tenant], messages)

    assert sent == [sender.BROADCAST_GROUP]  # 20 jobs × 2 groups: one send
    assert got[0] == (watched_job, {"job_id": 1, "status": "provisioning"})
    tenant_updates = [payload["job_id"] for group, payload in got if group == watched_tenant]
    assert tenant_updates == list(range(1, 21))  # every job, in order
    assert len(got) == 21  # nothing for the jobs nobody watches


def test_a_few_messages_still_go_group_by_group(monkeypatch):
    tag = uuid.uuid4().hex
    group = f"job.{tag}"
    sent = counted_group_sends(monkeypatch)

    got = delivered_through_a_hub([group], [([group, f"tenant.{tag}"], {"status": "running"})])

    assert sent == [group, f"tenant.{tag}"]
    assert got == [(group, {"status": "running"})]
