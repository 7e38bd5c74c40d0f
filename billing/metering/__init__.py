"""Metering: turn jobs' running time into priced, contiguous, unique usage records, and
keep the meters, job rollups and daily totals that the Cost Explorer reads.

Rooms: `spans` (billed time from a job's status changes), `prices` (price lookup),
`ledger` (a tick's priced pieces, charges and meter plans), `tick` (the tick and the
turns it takes), `writers` (SQL writers), `rollups` (rollup moves, marks, rebuild),
`tables` and `postgres` (SQL names and PostgreSQL bulk I/O). See docs/metering.md.
"""

from billing.metering.rollups import RollupMarks, roll_closed_days, rollup_marks, rollups_rebuild
from billing.metering.spans import Span, billed_spans
from billing.metering.tick import TickResult, meter_tick, release_pending_usage

__all__ = [
    "RollupMarks",
    "Span",
    "TickResult",
    "billed_spans",
    "meter_tick",
    "release_pending_usage",
    "roll_closed_days",
    "rollup_marks",
    "rollups_rebuild",
]
