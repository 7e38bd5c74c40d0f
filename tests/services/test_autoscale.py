"""services.autoscale: the decision as a pure function (samples in, replica count out),
by example and by property."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.autoscale import (
    AutoscalePolicy,
    Observation,
    Sample,
    autoscale_decide,
    window_average,
)
from services.models import AutoscaleMetric, ScaleWindow

NOW = 1_000_000.0


def policy(**overrides) -> AutoscalePolicy:
    values = {
        "metric": AutoscaleMetric.CONCURRENCY,
        "target": 10.0,
        "min_replicas": 1,
        "max_replicas": 10,
        "stable_window": 60,
        "panic_window": 6,
        "scale_to_zero_grace": 300,
    }
    values.update(overrides)
    return AutoscalePolicy(**values)


def steady(concurrency: float, seconds: int = 60, *, requests: int = 0) -> list[Sample]:
    """The same load in each of the last `seconds` seconds."""
    end = int(NOW)
    return [Sample(end - s, requests, concurrency) for s in range(1, seconds + 1)]


def seen(samples, **overrides) -> Observation:
    values = {
        "now": NOW,
        "samples": samples,
        "ready": 1,
        "previous": 1,
        "held": 0,
        "last_request_at": NOW - 1,
        "panic_until": None,
    }
    values.update(overrides)
    return Observation(**values)


def test_the_stable_window_asks_for_ceil_of_load_over_target():
    decision = autoscale_decide(policy(), seen(steady(25), ready=3, previous=3))
    assert (decision.desired, decision.window) == (3, ScaleWindow.STABLE)
    assert decision.stable_value == 25 and decision.panic_value == 25


def test_rps_counts_requests_per_second():
    samples = steady(0.1, requests=12)
    decision = autoscale_decide(policy(metric=AutoscaleMetric.RPS, target=5), seen(samples))
    assert decision.desired == 3 and decision.stable_value == 12


def test_missing_seconds_count_as_no_traffic():
    half = steady(20, seconds=30)  # 30 s of 20 in a 60 s window: 10 on average
    assert window_average(half, metric="concurrency", end=NOW, seconds=60) == 10
    # Samples outside the window (or of the second not over yet) are left out.
    late = [Sample(int(NOW), 0, 99.0), Sample(int(NOW) - 61, 0, 99.0)]
    assert window_average(half + late, metric="concurrency", end=NOW, seconds=60) == 10


def ticks(concurrency: float, seconds: float, *, requests: int = 0, tick: float = 0.25):
    """The same load in each tick of the last `seconds` seconds."""
    count = round(seconds / tick)
    return [Sample(NOW - tick * n, requests, concurrency, tick) for n in range(1, count + 1)]


def test_a_burst_after_a_quiet_window_is_averaged_over_its_own_length():
    # Half a second of 40 in flight into an idle service: over the whole panic window
    # it would be 40 × 0.5 / 6 = 3.3 (no panic); over the burst's own second, 20.
    decision = autoscale_decide(policy(), seen(ticks(40, 0.5)))
    assert (decision.desired, decision.window) == (2, ScaleWindow.PANIC)
    assert decision.panic_value == 20
    # Two seconds of it: over the burst's own two seconds, 40.
    assert autoscale_decide(policy(), seen(ticks(40, 2))).desired == 4


def test_a_burst_is_averaged_from_the_end_of_the_last_quiet_window():
    # Traffic 4.5 s ago, less than the 6 s panic window before the burst: the average
    # runs from there.
    earlier = [Sample(NOW - 4.5, 1, 1.0, 0.25)]
    decision = autoscale_decide(policy(), seen(ticks(40, 0.5) + earlier))
    assert decision.panic_value == round((40 * 0.5 + 0.25) / 4.5, 3)
    # ...and from 9 s ago, no gap of 6 s since: the whole panic window, no panic.
    earlier.append(Sample(NOW - 9, 1, 1.0, 0.25))
    decision = autoscale_decide(policy(), seen(ticks(40, 0.5) + earlier))
    assert decision.window == ScaleWindow.STABLE
    assert decision.panic_value == round((40 * 0.5 + 0.25) / 6, 3)
    # Traffic from the start of what was read: whether it was quiet before is unknown.
    assert autoscale_decide(policy(), seen(ticks(40, 60))).panic_value == 40


def test_a_few_requests_in_one_tick_are_no_burst():
    # 3 requests in a quarter of a second are 3 per second over the minimum span (1 s),
    # not 12: below twice the target of 5.
    rules = policy(metric=AutoscaleMetric.RPS, target=5)
    decision = autoscale_decide(rules, seen([Sample(NOW - 0.25, 3, 0.1, 0.25)]))
    assert (decision.window, decision.panic_value) == (ScaleWindow.STABLE, 3)


def test_a_burst_panics_and_scales_up_at_once():
    # 6 s of 40 in flight against 1 replica of target 10: the stable window says 1
    # (40 × 6 / 60 = 4 → 1), the panic window 4 (≥ 2 × the 1 ready).
    decision = autoscale_decide(policy(), seen(steady(40, seconds=6)))
    assert (decision.desired, decision.window) == (4, ScaleWindow.PANIC)
    assert decision.panic_until == NOW + 60


def test_no_scale_down_while_panicking():
    calm = steady(5, seconds=6)  # the panic window now asks for 1
    decision = autoscale_decide(policy(), seen(calm, ready=4, previous=4, panic_until=NOW + 30))
    assert (decision.desired, decision.window) == (4, ScaleWindow.PANIC)
    # A stable window after the last burst, the stable window decides again.
    after = autoscale_decide(policy(), seen(calm, ready=4, previous=4, panic_until=NOW - 1))
    assert (after.desired, after.window, after.panic_until) == (1, ScaleWindow.STABLE, None)


def test_under_twice_capacity_is_no_panic():
    decision = autoscale_decide(policy(), seen(steady(15, seconds=6), ready=1))
    assert decision.panic_until is None and decision.window == ScaleWindow.STABLE


def test_the_count_stays_within_min_and_max():
    assert autoscale_decide(policy(max_replicas=3), seen(steady(500))).desired == 3
    assert autoscale_decide(policy(min_replicas=2), seen(steady(0), previous=2)).desired == 2
    moved = autoscale_decide(policy(min_replicas=3), seen(steady(0), previous=2))
    assert (moved.desired, moved.window) == (3, ScaleWindow.BOUNDS)


def test_a_held_request_at_zero_is_a_cold_start():
    decision = autoscale_decide(
        policy(min_replicas=0), seen([], ready=0, previous=0, held=1, last_request_at=None)
    )
    assert (decision.desired, decision.window) == (1, ScaleWindow.COLD_START)


def test_many_held_requests_start_several_replicas():
    # 30 requests held for the last 3 s (the gateway counts them in flight).
    decision = autoscale_decide(
        policy(min_replicas=0),
        seen(steady(30, seconds=3), ready=0, previous=0, held=30, last_request_at=NOW - 1),
    )
    assert decision.desired == 3


def test_zero_only_after_the_grace_without_requests():
    scale_to_zero = policy(min_replicas=0, scale_to_zero_grace=300)
    recent = autoscale_decide(scale_to_zero, seen([], previous=1, last_request_at=NOW - 299))
    assert recent.desired == 1
    idle = autoscale_decide(scale_to_zero, seen([], previous=1, last_request_at=NOW - 300))
    assert (idle.desired, idle.window) == (0, ScaleWindow.IDLE)
    never = autoscale_decide(scale_to_zero, seen([], previous=2, last_request_at=None))
    assert never.desired == 0
    # At zero, with no request waiting, it stays there.
    stays = autoscale_decide(scale_to_zero, seen([], ready=0, previous=0))
    assert stays.desired == 0


def test_a_target_that_divides_exactly_asks_no_extra_replica():
    decision = autoscale_decide(policy(target=0.1), seen(steady(0.3), ready=3, previous=3))
    assert decision.desired == 3


loads = st.lists(st.floats(min_value=0, max_value=1000), min_size=0, max_size=60)


@st.composite
def situations(draw):
    low = draw(st.integers(min_value=0, max_value=5))
    high = draw(st.integers(min_value=max(1, low), max_value=20))
    rules = policy(
        metric=draw(st.sampled_from([AutoscaleMetric.CONCURRENCY, AutoscaleMetric.RPS])),
        target=draw(st.floats(min_value=0.1, max_value=100)),
        min_replicas=low,
        max_replicas=high,
    )
    values = draw(loads)
    end = int(NOW)
    samples = [Sample(end - 1 - i, int(v), v) for i, v in enumerate(values)]
    observation = seen(
        samples,
        ready=draw(st.integers(min_value=0, max_value=25)),
        previous=draw(st.integers(min_value=0, max_value=25)),
        held=draw(st.integers(min_value=0, max_value=100)),
        last_request_at=draw(st.one_of(st.none(), st.floats(NOW - 1000, NOW))),
        panic_until=draw(st.one_of(st.none(), st.floats(NOW - 100, NOW + 100))),
    )
    return rules, observation


@given(situations())
def test_never_above_max_nor_below_min_and_zero_only_when_allowed(situation):
    rules, observation = situation
    decision = autoscale_decide(rules, observation)
    assert rules.min_replicas <= decision.desired <= rules.max_replicas
    if observation.held:
        assert decision.desired >= 1  # a waiting request is never left at zero


@given(situations())
def test_never_down_while_panicking(situation):
    rules, observation = situation
    decision = autoscale_decide(rules, observation)
    if decision.panic_until is not None and observation.previous <= rules.max_replicas:
        assert decision.desired >= observation.previous


@given(
    st.floats(min_value=0, max_value=500),
    st.floats(min_value=0.5, max_value=50),
    st.integers(min_value=1, max_value=20),
)
def test_a_steady_load_settles_and_does_not_flap(load, target, start):
    """Fed its own decisions under a constant load, the count settles after one step and
    stays there."""
    rules = policy(target=target, min_replicas=0, max_replicas=30)
    previous, panic_until, counts = start, None, []
    for _ in range(10):
        decision = autoscale_decide(
            rules,
            seen(steady(load), ready=previous, previous=previous, panic_until=panic_until),
        )
        counts.append(decision.desired)
        previous, panic_until = decision.desired, decision.panic_until
    assert len(set(counts[1:])) == 1


def steady_at(concurrency: float, now: float) -> list[Sample]:
    return [Sample(int(now) - s, 0, concurrency) for s in range(1, 61)]


def test_a_dip_shorter_than_the_scale_down_delay_costs_no_replica():
    rules = policy(scale_down_delay=300)
    first = autoscale_decide(rules, seen(steady(15), ready=5, previous=5))
    assert (first.desired, first.lower_since) == (5, NOW)  # fewer wanted from now on
    later = autoscale_decide(
        rules,
        seen(steady_at(15, NOW + 299), now=NOW + 299, ready=5, previous=5, lower_since=NOW),
    )
    assert (later.desired, later.lower_since) == (5, NOW)
    # Traffic back up before the delay ran out: the count stays, the clock starts again.
    back = autoscale_decide(
        rules, seen(steady_at(50, NOW + 200), now=NOW + 200, ready=5, previous=5, lower_since=NOW)
    )
    assert (back.desired, back.lower_since) == (5, None)


def test_after_the_scale_down_delay_the_count_goes_to_what_is_wanted_then():
    rules = policy(scale_down_delay=300)
    decision = autoscale_decide(
        rules,
        seen(steady_at(15, NOW + 300), now=NOW + 300, ready=5, previous=5, lower_since=NOW),
    )
    assert (decision.desired, decision.window, decision.lower_since) == (
        2,
        ScaleWindow.STABLE,
        None,
    )


def test_bounds_lowered_by_hand_apply_at_once_whatever_the_delay():
    rules = policy(scale_down_delay=300, max_replicas=3)
    decision = autoscale_decide(rules, seen(steady(80), ready=8, previous=8))
    assert (decision.desired, decision.window) == (3, ScaleWindow.BOUNDS)


@given(situations(), st.integers(min_value=1, max_value=600), st.floats(0, 700))
def test_never_down_before_the_scale_down_delay(situation, delay, wanted_for):
    rules, observation = situation
    rules = policy(**{**rules.__dict__, "scale_down_delay": delay})
    observation = Observation(**{**observation.__dict__, "lower_since": NOW - wanted_for})
    decision = autoscale_decide(rules, observation)
    bounds_moved = not rules.min_replicas <= observation.previous <= rules.max_replicas
    if 0 < decision.desired < observation.previous and not bounds_moved:
        assert wanted_for >= delay


@given(
    st.lists(
        st.tuples(st.integers(min_value=1, max_value=240), st.floats(min_value=0.1, max_value=50)),
        max_size=40,
    )
)
def test_a_burst_window_never_sees_less_than_the_whole_panic_window(ticks_seen):
    """Averaging a burst over its own length only ever raises the panic window's value
    (what came before the burst is a quiet window away, outside the panic window)."""
    samples = [Sample(NOW - 0.25 * back, 1, value, 0.25) for back, value in set(ticks_seen)]
    decision = autoscale_decide(policy(), seen(samples))
    whole = window_average(samples, metric="concurrency", end=NOW, seconds=6)
    assert decision.panic_value >= round(whole, 3)
