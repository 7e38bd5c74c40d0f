"""Sync code publishes live updates through one kept event loop per process
(jobs.realtime.sender._publisher), not a new thread, loop and Redis connection per send."""

from __future__ import annotations

import asyncio
import copy
import threading
import uuid

from asgiref.sync import async_to_sync
from channels.layers import channel_layers

from jobs.realtime import sender as realtime


def received_after_sending(groups: list[str], payload: dict, sends: int = 1) -> list[dict]:
    """Join a receiver (its own layer, as another process would be) to `groups`, call the
    sync `send_to_groups` `sends` times, and return what reached the receiver."""
    receiver = channel_layers.make_backend("default")

    async def round_trip() -> list[dict]:
        channel = await receiver.new_channel()
        try:
            for group in groups:
                await receiver.group_add(group, channel)
            for _ in range(sends):
                # From a worker thread, as a Celery task or a sync view would publish.
                await asyncio.to_thread(realtime.send_to_groups, groups, payload)
            got = []
            for _ in range(sends * len(groups)):
                got.append(await asyncio.wait_for(receiver.receive(channel), timeout=5))
            return got
        finally:
            await receiver.close_pools()

    return async_to_sync(round_trip)()


def publishing_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "realtime"]


def test_sends_reach_every_group_through_one_kept_loop():
    first, second = f"job.{uuid.uuid4().hex}", f"tenant.{uuid.uuid4().hex}"

    got = received_after_sending([first, second], {"status": "running"}, sends=5)

    assert sorted(message["group"] for message in got) == sorted([first, second] * 5)
    assert {message["type"] for message in got} == {"relay"}
    assert all(message["payload"] == {"status": "running"} for message in got)
    loop = realtime._publisher()[0]
    realtime.send_to_groups([first], {"status": "done"})
    assert realtime._publisher()[0] is loop  # kept, not one per send
    assert len(publishing_threads()) == 1


def test_a_changed_channel_layer_setting_gets_a_new_publisher(settings):
    realtime.send_to_groups([f"job.{uuid.uuid4().hex}"], {"status": "running"})
    before = realtime._publisher()
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    layers["default"]["CONFIG"]["prefix"] += "-changed"
    settings.CHANNEL_LAYERS = layers  # channels drops its cached layer on this change

    after = realtime._publisher()
    group = f"job.{uuid.uuid4().hex}"
    got = received_after_sending([group], {"status": "queued"})

    assert after[0] is not before[0] and after[1] is not before[1]
    assert after[1].prefix.endswith("-changed")
    assert [message["group"] for message in got] == [group]
    for _ in range(50):
        if not before[0].is_running():
            break
        threading.Event().wait(0.05)
    assert not before[0].is_running()  # the replaced loop was stopped, not leaked


def test_an_unreachable_layer_is_logged_and_never_breaks_the_caller(settings, caplog):
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    layers["default"]["CONFIG"]["hosts"] = [{"address": "redis://127.0.0.1:1/0"}]
    settings.CHANNEL_LAYERS = layers

    realtime.send_to_groups(["job.1"], {"status": "running"})  # no exception

    assert "realtime publish to job.1 failed" in caplog.text
