"""What metering reads of a job, and the billed time it finds there.

A tick reads each candidate job as a plain `JobRow` and its status changes as
`StatusChange`s (never model instances: a tick reads thousands). A job is billed from
`running` (`BILL_OPENS`) for as long as its status stays in `BILLED_STATUSES` (running,
then pausing or cancelling until the backend reports its work ended); `billed_spans`
turns its changes into spans, and `split_span` cuts them at hours and price changes.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from typing import NamedTuple

from jobs.models import BILL_OPENS, BILLED_STATUSES

HOUR = timedelta(hours=1)


class JobRow(NamedTuple):
    """The columns of a job that metering reads (see JOB_COLUMNS)."""

    pk: int
    tenant_id: int
    name: str
    project: str
    status: str
    started_at: datetime | None
    gpu_type_id: int | None
    gpu_type__slug: str | None
    region_id: int
    region__slug: str
    gpus_per_node: int
    cpus: int
    pool__tier: str | None
    on_demand_nodes: int
    spot_nodes: int


JOB_COLUMNS = JobRow._fields


class StatusChange(NamedTuple):
    at: datetime
    to_status: str
    attempt: int


@dataclass(frozen=True)
class Span:
    start: datetime
    end: datetime
    attempt: int


def billed_spans(events, since: datetime, until: datetime) -> list[Span]:
    """Billed time of one job between `since` and `until`, from its status changes
    (anything with `at`, `to_status` and `attempt`, in time order)."""
    spans: list[Span] = []
    open_at: datetime | None = None
    attempt = 1
    for event in events:
        # Only `running` opens a bill: a job stopped before it ran (pausing or cancelling
        # from provisioning) pays nothing for its stop.
        if event.to_status == BILL_OPENS and open_at is None:
            open_at, attempt = event.at, event.attempt
        elif event.to_status not in BILLED_STATUSES and open_at is not None:
            spans.append(Span(open_at, event.at, attempt))
            open_at = None
    if open_at is not None:
        spans.append(Span(open_at, until, attempt))
    clipped = []
    for span in spans:
        start, end = max(span.start, since), min(span.end, until)
        if end > start:
            clipped.append(Span(start, end, span.attempt))
    return clipped


def split_span(span: Span, cut_points: list[datetime]) -> list[Span]:
    """Cut a span at hour boundaries and at the given instants (price changes, in time
    order), so each piece is priced by one version and rolls up into one hour."""
    next_hour = span.start.replace(minute=0, second=0, microsecond=0) + HOUR
    first = bisect_right(cut_points, span.start)  # the first instant after the start
    if span.end <= next_hour and (first == len(cut_points) or cut_points[first] >= span.end):
        return [span]  # the usual case: a tick's 30 s inside one hour and one price
    points = {p for p in cut_points[first:] if p < span.end}
    while next_hour < span.end:
        points.add(next_hour)
        next_hour += HOUR
    edges = [span.start, *sorted(points), span.end]
    return [Span(a, b, span.attempt) for a, b in pairwise(edges)]
