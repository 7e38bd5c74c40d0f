"""console.caching.akept: `kept` read on the event loop through redis.asyncio (the
services gateway's one read per request), with the cache's own keys and values and the
same answers: the keys found, and nothing (a warning) when Redis can't be reached."""

from __future__ import annotations

import logging
from decimal import Decimal

from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import override_settings

from console.caching import akept, kept, shared_cache

KEPT = {
    "answer": 42,
    "below-zero": -7,
    "flag": True,  # (an int subclass: pickled, not stored as a number)
    "price": Decimal("1.50"),
    "row": {"name": "echo", "ports": (40001, 40002)},
}
UNREACHABLE = {"default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}


def test_what_the_cache_keeps_is_read_back_and_missing_keys_are_left_out():
    shared_cache().set_many(KEPT)
    found = async_to_sync(akept)([*KEPT, "missing"])
    assert found == KEPT == kept([*KEPT, "missing"])
    assert type(found["answer"]) is int and type(found["flag"]) is bool
    assert async_to_sync(akept)(["missing"]) == {}
    assert async_to_sync(akept)([]) == {}


def test_an_unreachable_redis_is_a_warning_and_nothing_kept(caplog):
    shared_cache().set_many(KEPT)

    async def around_the_outage() -> list[dict[str, object]]:
        # One event loop throughout: its client is dropped when CACHES changes.
        before = await akept(["answer"])
        with override_settings(CACHES=UNREACHABLE):
            during = await akept(["answer"])
        return [before, during, await akept(["answer"])]

    with caplog.at_level(logging.WARNING, logger="console.caching"):
        assert async_to_sync(around_the_outage)() == [{"answer": 42}, {}, {"answer": 42}]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cache unreachable" in warnings[0].getMessage()


def test_another_cache_than_redis_is_read_through_kept():
    local = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(CACHES=local):
        shared_cache().set_many(KEPT)
        assert async_to_sync(akept)([*KEPT, "missing"]) == KEPT
