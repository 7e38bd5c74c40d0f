"""How many replicas a service wants, from what its gateway saw: a pure function.

Knative's autoscaler, for the two metrics the gateway measures itself (requests in flight
and requests per second, per replica):

- the metric is averaged over a **stable window** (60 s) and a **panic window** (6 s),
  from samples of a fraction of a second (services.traffic.TICK); each asks for
  `ceil(average / target)` replicas;
- normally the stable window decides, so a steady load never flaps and a load that stops
  is let go of slowly;
- when the panic window's demand reaches twice what the ready replicas can take, the
  service *panics*: the panic window decides at once, and until a stable window has
  passed without such a burst the wanted count never goes down;
- a burst after a quiet panic window is averaged over its own length (at least
  MIN_BURST_SECONDS) rather than the whole panic window, as Knative's windows average a
  partial window after a quiet one: a burst into an idle service is seen in half a
  second, not once it has filled the window;
- requests held at the gateway while no replica is ready ask for at least one (for
  concurrency, for as many as they fill at once);
- with `min_replicas` 0 the count goes to zero only after `scale_to_zero_grace` seconds
  without a request; above zero it stays within `min_replicas`…`max_replicas`;
- the count goes down (to one replica or more) only once the traffic has wanted fewer
  for `scale_down_delay` seconds without a break, and then to what it wants at that
  moment: a dip shorter than that never costs a replica that a moment later has to
  start cold again. Bounds moved by hand apply at once.

Time without a sample counts as zero: the gateway writes a sample only for a tick in
which the service had traffic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from services.models import AutoscaleMetric, ScaleWindow

# Panic when the panic window asks for this many times the ready replicas (Knative's 200 %).
PANIC_THRESHOLD = 2.0
# A burst's average spans at least this much, so a few requests in one tick are no burst.
MIN_BURST_SECONDS = 1.0


@dataclass(frozen=True)
class Sample:
    """What the gateway saw of one service in one stretch of time (summed over its
    processes)."""

    start: float  # unix time
    requests: int  # requests that arrived in it
    concurrency: float  # requests in flight in it, on average
    length: float = 1.0  # seconds

    def value(self, metric: str) -> float:
        """The metric in this stretch: requests per second, or requests in flight."""
        if metric == AutoscaleMetric.RPS:
            return self.requests / self.length
        return self.concurrency


@dataclass(frozen=True)
class AutoscalePolicy:
    metric: str
    target: float  # per replica
    min_replicas: int
    max_replicas: int
    stable_window: int  # seconds
    panic_window: int  # seconds
    scale_to_zero_grace: int  # seconds
    scale_down_delay: int = 0  # seconds


@dataclass(frozen=True)
class Observation:
    now: float  # unix time
    samples: Sequence[Sample]
    ready: int  # replicas serving now
    previous: int  # the last decision's count
    held: int  # requests waiting at the gateway for a ready replica
    last_request_at: float | None  # unix time, None if none within memory
    panic_until: float | None  # unix time, from the last decision
    lower_since: float | None = None  # unix time: since when fewer are wanted (last decision)
    # Where the samples end (unix time; the last whole second before `now` if None): a
    # stretch still being counted is not in them.
    samples_end: float | None = None


@dataclass(frozen=True)
class Decision:
    desired: int
    window: str  # a ScaleWindow: which rule decided
    stable_value: float  # the metric's average over the stable window
    panic_value: float  # … and over the panic window
    panic_until: float | None
    lower_since: float | None = None  # carried to the next decision


def window_average(samples: Sequence[Sample], *, metric: str, end: float, seconds: float) -> float:
    """The metric's average over the `seconds` before `end`."""
    total = sum(s.value(metric) * s.length for s in samples if end - seconds <= s.start < end)
    return total / max(seconds, 1e-9)


def burst_start(
    samples: Sequence[Sample], *, end: float, quiet: float, seen_from: float
) -> float | None:
    """When the traffic going on at `end` began after `quiet` seconds without any (None
    when there is none, or when the samples, read from `seen_from`, don't show the quiet
    before it)."""
    spans = sorted((s.start, s.start + s.length) for s in samples if seen_from <= s.start < end)
    if not spans:
        return None
    began = spans[-1][0]
    for start, stop in reversed(spans[:-1]):
        if began - stop >= quiet:
            break
        began = start
    return began if began - quiet >= seen_from else None


def replicas_for(value: float, target: float) -> int:
    # Rounded first: 3 × 0.1 / 0.1 must ask for 3 replicas, not 4.
    return max(0, math.ceil(round(value / target, 6)))


def autoscale_decide(policy: AutoscalePolicy, seen: Observation) -> Decision:
    """The replica count the service wants now (see the module's docstring)."""
    end = seen.samples_end if seen.samples_end is not None else math.floor(seen.now)
    stable = window_average(
        seen.samples, metric=policy.metric, end=end, seconds=policy.stable_window
    )
    panic_span: float = policy.panic_window
    began = burst_start(
        seen.samples,
        end=end,
        quiet=policy.panic_window,
        seen_from=end - max(policy.stable_window, policy.panic_window),
    )
    if began is not None:
        panic_span = min(panic_span, max(MIN_BURST_SECONDS, end - began))
    panic = window_average(seen.samples, metric=policy.metric, end=end, seconds=panic_span)
    stable_want = replicas_for(stable, policy.target)
    panic_want = replicas_for(panic, policy.target)
    panic_until = seen.panic_until if seen.panic_until and seen.panic_until > seen.now else None
    if panic > 0 and panic / policy.target >= PANIC_THRESHOLD * max(1, seen.ready):
        panic_until = seen.now + policy.stable_window  # (re)starts the panic
    if panic_until is not None:
        want, window = max(panic_want, seen.previous), ScaleWindow.PANIC
    else:
        want, window = stable_want, ScaleWindow.STABLE
    if seen.held:  # requests wait for a replica: never zero, and in flight already
        held_want = replicas_for(seen.held, policy.target)
        want = max(want, 1, held_want if policy.metric == AutoscaleMetric.CONCURRENCY else 1)
    if want == 0 and policy.min_replicas == 0 and seen.previous > 0:
        recent = seen.last_request_at is not None and (
            seen.now - seen.last_request_at < policy.scale_to_zero_grace
        )
        if recent:
            want = 1  # the grace before zero
        else:
            window = ScaleWindow.IDLE
    bounded = min(max(want, policy.min_replicas), policy.max_replicas)
    lower_since = None
    if not policy.min_replicas <= seen.previous <= policy.max_replicas:
        window = ScaleWindow.BOUNDS  # the bounds moved past the last count
    elif 0 < bounded < seen.previous and policy.scale_down_delay > 0:
        lower_since = seen.lower_since if seen.lower_since is not None else seen.now
        if seen.now - lower_since < policy.scale_down_delay:
            bounded = seen.previous  # not yet: the dip may pass
        else:
            lower_since = None
    if seen.ready == 0 and seen.previous == 0 and bounded > 0 and seen.held:
        window = ScaleWindow.COLD_START
    return Decision(
        desired=bounded,
        window=window,
        stable_value=round(stable, 3),
        panic_value=round(panic, 3),
        panic_until=panic_until,
        lower_since=lower_since,
    )
