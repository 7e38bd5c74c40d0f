"""How a tick's ledger and meters reach the database.

`_Writer` is what every writer does with a tick: the meters, then the records, then (only
if every record was new) the rollups and daily totals. `_PortableWriter` uses standard
SQL through `executemany` (SQLite and PostgreSQL); `_PostgresWriter` ships each kind of
row as one JSON document, so a tick is a few statements whatever its size.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from datetime import datetime

from django.db import connection

from billing.metering.ledger import RECORD_COLUMNS, MeterPlan, TickLedger
from billing.metering.postgres import binary_cursor, json_columns, json_rows_sql
from billing.metering.rollups import rollups_rebuild, upsert_rollups, upsert_totals
from billing.metering.tables import (
    JOB_TABLE,
    METER_COLUMNS,
    METER_PLAN_COLUMNS,
    METER_SUMS,
    METER_TABLE,
    RECORD_TABLE,
    ROLLUP_COLUMNS,
    ROLLUP_KEY,
    ROLLUP_SUMS,
    ROLLUP_TABLE,
    upsert_clause,
)

log = logging.getLogger(__name__)

METER_ROW_COLUMNS = (*METER_COLUMNS, "plan")
CHARGE_COLUMNS = ("job_id", "piece")
ROLLUP_PIECE_COLUMNS = ("bucket", "bucket_start", "gpu_type", "tier", "region", "currency",
                        *ROLLUP_SUMS)  # fmt: skip
PIECE_COLUMNS = RECORD_COLUMNS[RECORD_COLUMNS.index("attempt") :]
# The columns a record takes from its job row rather than from its priced piece.
FROM_JOB = {"tenant_id": "j.tenant_id", "job_ref": "j.id", "job_name": "j.name",
            "project": "j.project"}  # fmt: skip


def use_postgres_bulk_sql() -> bool:
    """Whether the tick writes through PostgreSQL's bulk statements (the fast path) or the portable
    `executemany` statements; tests run both on PostgreSQL and compare them."""
    return connection.vendor == "postgresql"


def tick_writer() -> _Writer:
    """The writer for this tick's database."""
    return _PostgresWriter() if use_postgres_bulk_sql() else _PortableWriter()


def _plan_values(plan: MeterPlan) -> tuple:
    """A plan as METER_PLAN_COLUMNS' values."""
    pending = plan.pending
    return (pending.hour, plan.day, pending.currency, pending.tier_1, pending.tier_2, *plan.sums)


class _Writer(ABC):
    """What every writer does with a tick; subclasses move the rows."""

    @abstractmethod
    def meters(self, plans: list[MeterPlan], new: list[tuple], moved: list[tuple]) -> None:
        """Insert the new meters and update the moved ones ((job, metered until, open,
        plan index) each): the cursor, the pending hour, and the plan's sums added to the
        slots."""

    @abstractmethod
    def insert_records(self, ledger: TickLedger, *, created_at: datetime) -> int:
        """Insert the tick's records, skipping any that exist; returns how many were new."""

    def add_to_rollups(self, ledger: TickLedger) -> None:
        """Add the tick's direct rollup pieces to their job rollup rows."""
        upsert_rollups(ledger.rollups())

    def ledger(self, ledger: TickLedger, *, created_at: datetime) -> None:
        if not ledger.charges:
            return
        inserted = self.insert_records(ledger, created_at=created_at)
        if inserted != len(ledger.charges):
            # Only a ledger edited behind the meters' back gets here: which records were
            # new is unknown, so the tenants' rollups are recomputed from the ledger.
            log.error(
                "metering: %s of %s records existed already",
                len(ledger.charges) - inserted,
                len(ledger.charges),
            )
            for tenant_id in sorted(ledger.tenants):
                rollups_rebuild(tenant_id=tenant_id)
            return
        if ledger.rollup_charges:
            self.add_to_rollups(ledger)
        upsert_totals(ledger.totals())


class _PortableWriter(_Writer):
    """Standard SQL through `executemany` (SQLite and PostgreSQL): one statement per
    kind of row, whatever the number of rows."""

    def __init__(self) -> None:
        self.adapt_datetime = connection.ops.adapt_datetimefield_value

    def meters(self, plans: list[MeterPlan], new: list[tuple], moved: list[tuple]) -> None:
        dt = self.adapt_datetime
        values = [(dt(hour), dt(day), *rest) for hour, day, *rest in map(_plan_values, plans)]
        with connection.cursor() as cursor:
            if new:
                columns = (*METER_COLUMNS, *METER_PLAN_COLUMNS)
                cursor.executemany(
                    f"INSERT INTO {METER_TABLE} ({', '.join(columns)}) "  # noqa: S608
                    f"VALUES ({', '.join(['%s'] * len(columns))})",
                    [(job_id, dt(until), is_open, *values[plan])
                     for job_id, until, is_open, plan in new],
                )  # fmt: skip
            if moved:
                added = ", ".join(f"{c} = {c} + %s" for c in METER_SUMS)
                cursor.executemany(
                    f"UPDATE {METER_TABLE} SET metered_until = %s, open = %s, "  # noqa: S608
                    f"hour = %s, day = %s, currency = %s, tier_1 = %s, tier_2 = %s, {added} "
                    "WHERE job_id = %s",
                    [(dt(until), is_open, *values[plan], job_id)
                     for job_id, until, is_open, plan in moved],
                )  # fmt: skip

    def insert_records(self, ledger: TickLedger, *, created_at: datetime) -> int:
        dt = self.adapt_datetime
        columns = ("job_id", *RECORD_COLUMNS, "created_at")
        created = dt(created_at)
        params = [
            (r.job_ref, *r[:8], dt(r.interval_start), dt(r.interval_end), *r[10:20], created)
            for r in ledger.rows()
        ]
        with connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {RECORD_TABLE} ({', '.join(columns)}) "  # noqa: S608
                f"VALUES ({', '.join(['%s'] * len(columns))}) ON CONFLICT DO NOTHING",
                params,
            )
            return cursor.rowcount


class _PostgresWriter(_Writer):
    """PostgreSQL: the meters, the charges and the priced pieces each travel as one JSON
    document, so a tick is a few statements whose size doesn't grow with the number of
    parameters. Each record takes its job's own fields from the job row (locked by this
    tick), the rest from its priced piece; meters take their plan the same way."""

    def meters(self, plans: list[MeterPlan], new: list[tuple], moved: list[tuple]) -> None:
        plan_rows = json_rows_sql(METER_PLAN_COLUMNS, numbered=True)
        plan_values = [json_columns([_plan_values(p) for p in plans], METER_PLAN_COLUMNS)]
        with binary_cursor() as cursor:
            if new:
                columns = (*METER_COLUMNS, *METER_PLAN_COLUMNS)
                cursor.execute(
                    f"INSERT INTO {METER_TABLE} ({', '.join(columns)}) "  # noqa: S608
                    f"SELECT {', '.join(f'v.{c}' for c in METER_COLUMNS)}, "
                    f"{', '.join(f'p.{c}' for c in METER_PLAN_COLUMNS)} "
                    f"FROM {json_rows_sql(METER_ROW_COLUMNS)} AS v "
                    f"JOIN {plan_rows} AS p ON p.n = v.plan",
                    [json_columns(new, METER_ROW_COLUMNS), *plan_values],
                )
            if moved:
                pending = ", ".join(f"{c} = p.{c}" for c in METER_PLAN_COLUMNS[:5])
                added = ", ".join(f"{c} = m.{c} + p.{c}" for c in METER_SUMS)
                cursor.execute(
                    f"UPDATE {METER_TABLE} AS m "  # noqa: S608
                    f"SET metered_until = v.metered_until, open = v.open, {pending}, {added} "
                    f"FROM {json_rows_sql(METER_ROW_COLUMNS)} AS v "
                    f"JOIN {plan_rows} AS p ON p.n = v.plan WHERE m.job_id = v.job_id",
                    [json_columns(moved, METER_ROW_COLUMNS), *plan_values],
                )

    def insert_records(self, ledger: TickLedger, *, created_at: datetime) -> int:
        record_columns = ("job_id", *RECORD_COLUMNS, "created_at")
        values = ", ".join(FROM_JOB.get(c, f"p.{c}") for c in RECORD_COLUMNS)
        sql = f"""
            INSERT INTO {RECORD_TABLE} ({", ".join(record_columns)})
            SELECT j.id, {values}, %s
            FROM {json_rows_sql(CHARGE_COLUMNS)} AS c
            JOIN {JOB_TABLE} AS j ON j.id = c.job_id
            JOIN {json_rows_sql(PIECE_COLUMNS, numbered=True)} AS p ON p.n = c.piece
            ON CONFLICT DO NOTHING
        """  # noqa: S608 (table and column names are ours; values are parameters)
        charges = [(job.pk, index) for job, index in ledger.charges]
        with binary_cursor() as cursor:
            cursor.execute(
                sql,
                [
                    created_at,
                    json_columns(charges, CHARGE_COLUMNS),
                    json_columns(ledger.pieces, PIECE_COLUMNS),
                ],
            )
            return cursor.rowcount

    def add_to_rollups(self, ledger: TickLedger) -> None:
        # A tick's first of a new hour sends every job's last piece here: as many rows as
        # jobs, so they travel like the records.
        values = ", ".join(FROM_JOB.get(c, f"p.{c}") for c in ROLLUP_COLUMNS)
        sql = f"""
            INSERT INTO {ROLLUP_TABLE} ({", ".join(ROLLUP_COLUMNS)})
            SELECT {values}
            FROM {json_rows_sql(CHARGE_COLUMNS)} AS c
            JOIN {JOB_TABLE} AS j ON j.id = c.job_id
            JOIN {json_rows_sql(ROLLUP_PIECE_COLUMNS, numbered=True)} AS p ON p.n = c.piece
            {upsert_clause(ROLLUP_TABLE, ROLLUP_KEY)}
        """  # noqa: S608 (table and column names are ours; values are parameters)
        charges = [(job.pk, index) for job, index in ledger.rollup_charges]
        with binary_cursor() as cursor:
            cursor.execute(
                sql,
                [
                    json_columns(charges, CHARGE_COLUMNS),
                    json_columns(ledger.rollup_pieces, ROLLUP_PIECE_COLUMNS),
                ],
            )
