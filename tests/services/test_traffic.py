"""services.traffic: a gateway process's tally, and the counters in the test Redis that
several processes add to and the reconcile pass reads."""

from __future__ import annotations

import time

import pytest

from services import traffic
from services.autoscale import Sample


def test_a_tally_counts_requests_and_time_in_flight(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(traffic.time, "monotonic", lambda: clock[0])
    tally = traffic.TrafficTally()
    tally.started(7)
    clock[0] += 0.5
    tally.started(7)  # two in flight from here
    clock[0] += 0.5
    tally.finished(7)
    assert tally.take() == {7: (2, 1.5)}  # 0.5 s × 1 + 0.5 s × 2
    clock[0] += 1
    assert tally.take() == {7: (0, 1.0)}  # the one still in flight
    tally.finished(7)
    clock[0] += 1
    assert tally.take() == {} and tally.services == {}  # idle: forgotten


def test_samples_add_up_over_processes_and_ticks(db):
    tick = traffic.tick_of(time.time()) - 12
    start = tick * traffic.TICK
    traffic.traffic_record(tick=tick, taken={5: (4, 0.125)})
    traffic.traffic_record(tick=tick, taken={5: (6, 0.125), 6: (1, 0.25)})  # another process
    traffic.traffic_record(tick=tick + 1, taken={5: (1, 0.0625)})
    # Request-seconds over the tick's length: requests in flight on average.
    samples = traffic.traffic_samples(service_id=5, end=start + 3, seconds=10)
    assert samples == [
        Sample(start, 10, 1.0, traffic.TICK),
        Sample(start + traffic.TICK, 1, 0.25, traffic.TICK),
    ]
    assert traffic.last_request_at(service_id=5) == start + traffic.TICK
    # Only the ticks in the `seconds` before `end`.
    assert traffic.traffic_samples(service_id=5, end=start + traffic.TICK, seconds=1) == [
        Sample(start, 10, 1.0, traffic.TICK)
    ]


def test_the_samples_end_where_every_process_has_added_its_tick():
    # A tick is complete once over, and added FLUSH_AFTER later: readers wait READ_AFTER.
    assert traffic.FLUSH_AFTER < traffic.READ_AFTER < traffic.TICK
    assert traffic.samples_end(1000.0 + traffic.READ_AFTER) == 1000.0
    assert traffic.samples_end(1000.0 + traffic.READ_AFTER / 2) == 1000.0 - traffic.TICK


def test_the_held_queue_is_bounded_and_marks_when_the_wait_began(db, settings):
    settings.SERVICE_COLD_START_QUEUE = 2
    before = time.time()
    assert traffic.held_enter(service_id=9) == 1
    assert traffic.held_enter(service_id=9) == 2
    assert traffic.held_enter(service_id=9) is None  # full: not counted
    assert traffic.held_counts(service_ids=[9, 10]) == {9: 2, 10: 0}
    since = traffic.waiting_since(service_id=9)
    assert since is not None and before <= since <= time.time()
    traffic.held_leave(service_id=9)
    assert traffic.held_enter(service_id=9) == 2
    traffic.waiting_recorded(service_id=9)
    assert traffic.waiting_since(service_id=9) is None


def test_a_tally_counts_requests_in_flight_per_replica_and_flushes_changes():
    tally = traffic.TrafficTally()
    tally.replica_started(3)
    tally.replica_started(3)
    tally.replica_started(4)
    assert tally.take_replicas() == {3: 2, 4: 1}
    assert tally.take_replicas() == {}  # nothing changed
    tally.replica_finished(4)
    tally.replica_started(5)
    tally.replica_finished(5)  # started and ended between two flushes: nothing to add
    assert tally.take_replicas() == {4: -1}
    assert tally.replicas == {3: 2} and tally.flushed == {3: 2}  # the idle forgotten
    tally.replica_finished(3)
    changes = tally.take_replicas()
    assert changes == {3: -1}
    tally.replicas_not_flushed(changes)  # Redis failed: the next flush adds them too
    tally.replica_finished(3)
    assert tally.take_replicas() == {3: -2}


@pytest.mark.parametrize("finished_first", [False, True])
def test_requests_in_flight_per_replica_add_up_over_processes(db, finished_first):
    if finished_first:  # a count lost (its key gone) never goes below zero
        traffic.replicas_in_flight_add(changes={3: -1})
    traffic.replicas_in_flight_add(changes={3: 2, 4: 1})
    traffic.replicas_in_flight_add(changes={3: -1, 4: -1})  # (another process)
    assert traffic.replicas_in_flight(replica_ids=[3, 4]) == {3: 1, 4: 0}
    traffic.replicas_forget(replica_ids=[3])
    assert traffic.replicas_in_flight(replica_ids=[3]) == {3: 0}
