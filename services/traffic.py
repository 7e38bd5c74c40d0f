"""The gateway's traffic counters, in Django's cache (the console's Redis), so that every
ASGI process adds to the same numbers and the reconcile pass reads them.

Per service:
- one sample per tick (TICK, a quarter of a second) with traffic: requests that arrived,
  and requests in flight on average (kept as request-microseconds: the cache counts in
  integers); each gateway process keeps its own tally (`TrafficTally`) and adds it after
  each tick, so counting costs a request no round trip, and a burst reaches the
  autoscaler within a tick or two rather than once a whole second is over;
- when the last tick with a request began, for the idle time before scaling to zero;
- requests held while no replica is ready (bounded), and when the first of them arrived
  (the start of a cold start).
Per replica: requests in flight, so that a draining replica is stopped only once idle.
Each process counts its own as they start and end, and adds what changed since its last
flush with the tick's tally (no round trip per request either): the shared count lags a
process's own by up to a tick, which the reconcile pass allows for
(services.scaling.DRAIN_MIN_SECONDS).

A counter lost (Redis restarted, a process killed mid-request) costs precision, never a
request: a draining replica is stopped after a timeout whatever its counter says.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from services.autoscale import Sample

# How long samples are kept beyond the stable window (a reconcile pass may come late).
SAMPLE_SLACK_SECONDS = 60
# The samples' length in seconds (a whole number of them makes a second).
TICK = 0.25
# Each process adds a tick's tally this long after the tick ends: a reader leaves the
# ticks that ended more recently out, as they may still be partly counted.
FLUSH_AFTER = 0.01
READ_AFTER = 0.05


def tick_of(moment: float) -> int:
    """The number of the tick `moment` (unix time) falls in."""
    return int(moment // TICK)


def samples_end(now: float) -> float:
    """Unix time up to which every process has added its samples, as of `now`."""
    return tick_of(now - READ_AFTER) * TICK


def _key(*parts: object) -> str:
    return "svc:" + ":".join(str(part) for part in parts)


def _add(key: str, amount: int, timeout: float | None) -> int:
    """Add `amount` to the integer at `key` (created with `timeout`); its new value."""
    cache.add(key, 0, timeout)
    try:
        return int(cache.incr(key, amount))
    except ValueError:  # expired between the two calls
        cache.add(key, 0, timeout)
        return int(cache.incr(key, amount))


@dataclass
class ServiceTally:
    """One process's traffic of one service since its last flush."""

    in_flight: int = 0
    requests: int = 0
    busy: float = 0.0  # request-seconds in flight since the flush
    since: float = 0.0  # monotonic time `busy` was last brought up to date

    def advance(self, now: float) -> None:
        self.busy += self.in_flight * (now - self.since)
        self.since = now


class TrafficTally:
    """A gateway process's own tally, in memory, touched only on its event loop."""

    def __init__(self) -> None:
        self.services: dict[int, ServiceTally] = {}
        self.replicas: dict[int, int] = {}  # requests in flight per replica, now
        self.flushed: dict[int, int] = {}  # ... as last added to the shared counts

    def started(self, service_id: int) -> None:
        now = time.monotonic()
        tally = self.services.get(service_id)
        if tally is None:
            tally = self.services[service_id] = ServiceTally(since=now)
        tally.advance(now)
        tally.in_flight += 1
        tally.requests += 1

    def finished(self, service_id: int) -> None:
        tally = self.services[service_id]
        tally.advance(time.monotonic())
        tally.in_flight -= 1

    def replica_started(self, replica_id: int) -> None:
        self.replicas[replica_id] = self.replicas.get(replica_id, 0) + 1

    def replica_finished(self, replica_id: int) -> None:
        self.replicas[replica_id] -= 1

    def take_replicas(self) -> dict[int, int]:
        """How each replica's requests in flight changed since the last take (replicas
        with no change left out; idle ones forgotten once flushed)."""
        changes = {}
        for replica_id in set(self.replicas) | set(self.flushed):
            now, before = self.replicas.get(replica_id, 0), self.flushed.get(replica_id, 0)
            if now != before:
                changes[replica_id] = now - before
        self.replicas = {r: n for r, n in self.replicas.items() if n}
        self.flushed = dict(self.replicas)
        return changes

    def replicas_not_flushed(self, changes: dict[int, int]) -> None:
        """`changes` (from `take_replicas`) never reached the shared counts."""
        for replica_id, change in changes.items():
            self.flushed[replica_id] = self.flushed.get(replica_id, 0) - change

    def take(self) -> dict[int, tuple[int, float]]:
        """(requests, request-seconds in flight) per service since the last take; tallies
        with nothing in flight are forgotten."""
        now = time.monotonic()
        taken = {}
        for service_id, tally in list(self.services.items()):
            tally.advance(now)
            if tally.requests or tally.busy:
                taken[service_id] = (tally.requests, tally.busy)
            tally.requests, tally.busy = 0, 0.0
            if not tally.in_flight:
                del self.services[service_id]
        return taken


def traffic_record(*, tick: int, taken: dict[int, tuple[int, float]]) -> None:
    """Add one process's tally (`TrafficTally.take`) to the tick's samples."""
    keep = settings.SERVICE_AUTOSCALE_STABLE_WINDOW + SAMPLE_SLACK_SECONDS
    for service_id, (requests, busy) in taken.items():
        if requests:
            _add(_key(service_id, "requests", tick), requests, keep)
        if busy:
            _add(_key(service_id, "busy", tick), round(busy * 1e6), keep)
        if requests or busy:
            grace = settings.SERVICE_SCALE_TO_ZERO_GRACE + SAMPLE_SLACK_SECONDS
            cache.set(_key(service_id, "last"), tick * TICK, grace)


def traffic_samples(*, service_id: int, end: float, seconds: float) -> list[Sample]:
    """The service's samples of the ticks in the `seconds` before `end` (a tick's start)."""
    last = tick_of(end + TICK / 2)  # `end` is a tick's start: rounding, not flooring
    keys = {
        tick: (_key(service_id, "requests", tick), _key(service_id, "busy", tick))
        for tick in range(last - round(seconds / TICK), last)
    }
    found = cache.get_many([key for pair in keys.values() for key in pair])
    samples = []
    for tick, (requests_key, busy_key) in keys.items():
        requests, busy = found.get(requests_key, 0), found.get(busy_key, 0)
        if requests or busy:
            samples.append(
                Sample(
                    start=tick * TICK,
                    requests=int(requests),
                    concurrency=busy / 1e6 / TICK,
                    length=TICK,
                )
            )
    return samples


def last_request_at(*, service_id: int) -> float | None:
    value = cache.get(_key(service_id, "last"))
    return float(value) if value is not None else None


def held_enter(*, service_id: int) -> int | None:
    """Count one more request held for the service; None when the queue is full (it is
    then not counted). The first one also marks when the wait began."""
    timeout = settings.SERVICE_COLD_START_TIMEOUT + SAMPLE_SLACK_SECONDS
    count = _add(_key(service_id, "held"), 1, timeout)
    if count > settings.SERVICE_COLD_START_QUEUE:
        held_leave(service_id=service_id)
        return None
    cache.add(_key(service_id, "waiting_since"), time.time(), timeout)
    return count


def held_leave(*, service_id: int) -> None:
    try:
        if cache.decr(_key(service_id, "held")) < 0:
            cache.delete(_key(service_id, "held"))
    except ValueError:  # expired: nothing to count down
        pass


def held_counts(*, service_ids: Iterable[int]) -> dict[int, int]:
    ids = list(service_ids)
    found = cache.get_many([_key(service_id, "held") for service_id in ids])
    return {i: max(0, int(found.get(_key(i, "held"), 0))) for i in ids}


def waiting_since(*, service_id: int) -> float | None:
    """When the first request held for the service (still unrecorded) arrived."""
    value = cache.get(_key(service_id, "waiting_since"))
    return float(value) if value is not None else None


def waiting_recorded(*, service_id: int) -> None:
    """The cold start that began then is over (and recorded)."""
    cache.delete(_key(service_id, "waiting_since"))


def replicas_in_flight_add(*, changes: dict[int, int]) -> bool:
    """Add one process's changes of requests in flight per replica (`take_replicas`)."""
    for replica_id, change in changes.items():
        key = _key("replica", replica_id, "in_flight")
        if change > 0:
            _add(key, change, None)
        else:
            with contextlib.suppress(ValueError):  # forgotten meanwhile (its row is gone)
                cache.decr(key, -change)
    return True


def replicas_in_flight(*, replica_ids: Iterable[int]) -> dict[int, int]:
    ids = list(replica_ids)
    found = cache.get_many([_key("replica", i, "in_flight") for i in ids])
    return {i: max(0, int(found.get(_key("replica", i, "in_flight"), 0))) for i in ids}


def replicas_forget(*, replica_ids: Iterable[int]) -> None:
    cache.delete_many([_key("replica", i, "in_flight") for i in replica_ids])
