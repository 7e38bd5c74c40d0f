"""A tick's ledger: the priced pieces of usage it charges to jobs, and the plans for the
jobs' meters and rollups.

Most running jobs bill the same 30 s at the same price, so a piece is priced once per
tick for each (span piece, tier, units, GPU type, region, discount) and charged to many
jobs; meter plans are shared the same way. The writers ship pieces and charges, never
one full row per record where they can avoid it.
"""

from __future__ import annotations

from collections import Counter, namedtuple
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from billing.metering.prices import PriceBook, gap_note
from billing.metering.spans import JobRow, Span, split_span
from billing.models import AMOUNT_QUANTUM, Bucket
from marketplace.models import Tier

SECONDS_QUANTUM = Decimal("0.001")
MICROSECONDS = Decimal(1_000_000)
ZERO = Decimal(0)


class Piece(NamedTuple):
    """A priced piece of usage: everything of a record but its job's own fields."""

    attempt: int
    tier: str
    gpu_type_id: int | None
    region_id: int
    interval_start: datetime
    interval_end: datetime
    units: int
    gpu_seconds: Decimal
    cpu_seconds: Decimal
    price_version_id: int | None
    unit_price: Decimal
    discount_percent: Decimal
    amount: Decimal
    on_demand_amount: Decimal
    currency: str
    note: str
    # Not stored in the record: what its rollups need.
    hour_start: datetime
    gpu_type: str  # slug, or "cpu"
    region: str  # slug


# One usage record to write: its job's own fields, then its priced piece's (the fields
# after `note` only feed the rollups).
LedgerRow = namedtuple("LedgerRow", ("tenant_id", "job_ref", "job_name", "project", *Piece._fields))


RECORD_COLUMNS = LedgerRow._fields[: LedgerRow._fields.index("note") + 1]


def _tiers(job: JobRow) -> list[tuple[str, int]]:
    """(tier, units) shares of a job: each node billed at its actual tier."""
    per_node = job.gpus_per_node if job.gpu_type_id else job.cpus
    base_tier = job.pool__tier or Tier.ON_DEMAND
    shares = [(base_tier, job.on_demand_nodes * per_node), (Tier.SPOT, job.spot_nodes * per_node)]
    return [(tier, units) for tier, units in shares if units > 0]


class PendingHour(NamedTuple):
    """A meter's pending hour (see `JobMeter`): the hour, its currency, each slot's tier."""

    hour: datetime | None
    currency: str
    tier_1: str
    tier_2: str


NO_PENDING_HOUR = PendingHour(None, "", "", "")


class MeterPlan(NamedTuple):
    """What one tick does with a job's usage, given its meter's pending hour: the meter's new
    pending hour, the sums added to its slots, and the rollup pieces (indices) that go to
    the job's rollup rows at once."""

    pending: PendingHour
    day: datetime | None
    sums: tuple[Decimal, ...]  # slot 1's four sums (ROLLUP_SUMS), then slot 2's
    direct: tuple[int, ...]

    def changes(self, pending: PendingHour) -> bool:
        """Whether the meter whose pending hour was `pending` changes."""
        return self.pending != pending or any(self.sums)


class TickLedger:
    """A tick's records as (job, priced piece) charges, each piece priced once per tick
    (see the module docstring).

    Rollups are planned the same way, once per (pieces of a job, its meter's pending hour).
    Pieces of the tick's hour go to the meter's slots; the rest (another hour, a third
    tier, another currency) become rollup pieces charged to the job's rollup rows."""

    def __init__(self, book: PriceBook, *, hour: datetime, monthly_mark: datetime | None):
        self.book = book
        self.hour = hour  # the tick's hour (UTC): the one meters hold
        self.monthly_mark = monthly_mark
        self.pieces: list[Piece] = []
        self.charges: list[tuple[JobRow, int]] = []  # (job, index into `pieces`)
        self._index: dict[tuple, int] = {}
        self._charged: dict[tuple, tuple[list[int], int]] = {}
        self.plans: list[MeterPlan] = []
        self._plan_index: dict[tuple, int] = {}
        # (bucket, start, GPU type, tier, region, currency, *ROLLUP_SUMS)
        self.rollup_pieces: list[tuple] = []
        self.rollup_charges: list[tuple[JobRow, int]] = []  # (job, index into the above)
        self._rollup_index: dict[tuple, int] = {}

    def charge(self, job: JobRow, spans: list[Span], pending: PendingHour) -> int:
        """Charge a job's billed spans; returns the index of its meter's plan. Jobs alike
        in all that prices them, billed the same spans from the same pending hour (most
        running jobs, each tick), share the work."""
        discount = self.book.discounts.get(job.tenant_id, ZERO)
        per_node = job.gpus_per_node if job.gpu_type_id else job.cpus
        alike = (tuple(spans), pending, job.gpu_type_id, job.region_id, job.pool__tier,
                 job.on_demand_nodes, job.spot_nodes, per_node, discount)  # fmt: skip
        charged = self._charged.get(alike)
        if charged is None:
            charged = self._charged[alike] = self._price(job, spans, pending, discount)
        pieces, plan = charged
        self.charges.extend([(job, index) for index in pieces])
        direct = self.plans[plan].direct
        if direct:
            self.rollup_charges.extend([(job, index) for index in direct])
        return plan

    def _price(self, job: JobRow, spans, pending: PendingHour, discount: Decimal) -> tuple:
        """(indices of the job's priced pieces, index of its meter's plan)."""
        tiers = _tiers(job)
        pieces = []
        for span in spans:
            for piece in split_span(span, self.book.change_points):
                for tier, units in tiers:
                    key = (piece, tier, units, job.gpu_type_id, job.region_id, discount)
                    index = self._index.get(key)
                    if index is None:
                        index = self._index[key] = len(self.pieces)
                        self.pieces.append(self._tail(job, piece, tier, units, discount))
                    pieces.append(index)
        key = (tuple(pieces), pending)
        plan = self._plan_index.get(key)
        if plan is None:
            plan = self._plan_index[key] = len(self.plans)
            self.plans.append(self._plan(*key))
        return pieces, plan

    def rows(self) -> list[LedgerRow]:
        """Every record in full."""
        pieces = self.pieces
        return [
            LedgerRow._make((job.tenant_id, job.pk, job.name, job.project, *pieces[index]))
            for job, index in self.charges
        ]

    @property
    def tenants(self) -> set[int]:
        return {job.tenant_id for job, _ in self.charges}

    def rollups(self) -> dict[tuple, list]:
        """The job rollup rows added to directly, as `upsert_rollups` takes them."""
        pieces = self.rollup_pieces
        return {
            (job.tenant_id, bucket, start, job.pk, gpu_type, tier, region): [
                job.name, job.project, currency, *sums
            ]
            for job, index in self.rollup_charges
            for bucket, start, gpu_type, tier, region, currency, *sums in (pieces[index],)
        }  # fmt: skip

    def totals(self) -> dict[tuple, list]:
        """This tick's daily totals (tenant × day × GPU type × tier × region), from each
        piece's sums times the number of its charges."""
        sums: dict[tuple, list] = {}
        for (tenant_id, index), count in Counter(
            (job.tenant_id, index) for job, index in self.charges
        ).items():
            p = self.pieces[index]
            key = (tenant_id, p.hour_start.replace(hour=0), p.gpu_type, p.tier, p.region)
            row = sums.setdefault(key, [p.currency, ZERO, ZERO, ZERO, ZERO])
            for i, value in enumerate(_sums_of(p), start=1):
                row[i] += value * count
        return sums

    def _plan(self, pieces: tuple[int, ...], pending: PendingHour) -> MeterPlan:
        hour, currency, tiers = pending.hour, pending.currency, [pending.tier_1, pending.tier_2]
        sums = [ZERO] * 8
        direct: dict[tuple, list[Decimal]] = {}
        for index in pieces:
            p = self.pieces[index]
            slot = None
            fits = hour in (None, self.hour) and currency in ("", p.currency)
            if fits and p.hour_start == self.hour:
                if p.tier in tiers:
                    slot = tiers.index(p.tier)
                elif "" in tiers:
                    slot = tiers.index("")
            if slot is not None:
                hour, currency, tiers[slot] = self.hour, p.currency, p.tier
                for i, value in enumerate(_sums_of(p)):
                    sums[4 * slot + i] += value
                continue
            day = p.hour_start.replace(hour=0)
            buckets = [(Bucket.HOUR, p.hour_start), (Bucket.DAY, day)]
            if self.monthly_mark is not None and day < self.monthly_mark:
                buckets.append((Bucket.MONTH, day.replace(day=1)))  # a day already rolled
            for bucket, start in buckets:
                key = (bucket, start, p.gpu_type, p.tier, p.region, p.currency)
                row = direct.setdefault(key, [ZERO] * 4)
                for i, value in enumerate(_sums_of(p)):
                    row[i] += value
        indices = []
        for key, row in direct.items():
            # One row per key and job: the currency is the first piece's, as in a rollup.
            piece = (*key, *row)
            index = self._rollup_index.get(piece)
            if index is None:
                index = self._rollup_index[piece] = len(self.rollup_pieces)
                self.rollup_pieces.append(piece)
            indices.append(index)
        new_pending = PendingHour(hour, currency, *tiers)
        day = hour.replace(hour=0) if hour is not None else None
        return MeterPlan(new_pending, day, tuple(sums), tuple(indices))

    def _tail(self, job: JobRow, piece: Span, tier: str, units: int, discount: Decimal):
        start = piece.start
        price = self.book.price(job, tier, start)
        # Exact: a timedelta is a whole number of microseconds.
        seconds = Decimal((piece.end - start) // timedelta(microseconds=1)) / MICROSECONDS
        unit_seconds = (seconds * units).quantize(SECONDS_QUANTUM)
        is_gpu = job.gpu_type_id is not None
        return Piece(
            piece.attempt,
            tier,
            job.gpu_type_id,
            job.region_id,
            start,
            piece.end,
            units,
            unit_seconds if is_gpu else ZERO,
            ZERO if is_gpu else unit_seconds,
            price.version_id,
            price.unit_price,
            discount,
            (unit_seconds * price.unit_price / 3600).quantize(AMOUNT_QUANTUM),
            (unit_seconds * price.on_demand_price / 3600).quantize(AMOUNT_QUANTUM),
            price.currency,
            gap_note(job, start) if price.is_gap else "",
            start.astimezone(UTC).replace(minute=0, second=0, microsecond=0),
            job.gpu_type__slug if is_gpu else "cpu",
            job.region__slug,
        )


def _sums_of(p) -> tuple[Decimal, Decimal, Decimal, Decimal]:
    return p.gpu_seconds, p.cpu_seconds, p.amount, p.on_demand_amount
