"""Bulk I/O through psycopg on PostgreSQL, where a big tick spends most of its time.

- `fetch_rows` reads `values_list` rows with psycopg's C timestamptz loader.
- `binary_cursor` binds parameters on the server, in binary.
- `json_columns` / `json_rows_sql` carry many rows as one JSON document parameter.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import psycopg
from django.db import connection
from psycopg.types.datetime import TimestamptzLoader

from billing.metering.tables import ROLLUP_SUMS

# PostgreSQL types of the columns rows travel in: LedgerRow's fields, a meter's, a charge's.
COLUMN_TYPES = {
    "tenant_id": "bigint",
    "job_ref": "bigint",
    "job_name": "text",
    "project": "text",
    "attempt": "integer",
    "tier": "text",
    "gpu_type_id": "bigint",
    "region_id": "bigint",
    "interval_start": "timestamptz",
    "interval_end": "timestamptz",
    "units": "integer",
    "gpu_seconds": "numeric",
    "cpu_seconds": "numeric",
    "price_version_id": "bigint",
    "unit_price": "numeric",
    "discount_percent": "numeric",
    "amount": "numeric",
    "on_demand_amount": "numeric",
    "currency": "text",
    "note": "text",
    "hour_start": "timestamptz",
    "gpu_type": "text",
    "region": "text",
    "job_id": "bigint",
    "metered_until": "timestamptz",
    "open": "boolean",
    "piece": "integer",
    "plan": "integer",
    "bucket": "text",
    "bucket_start": "timestamptz",
    "hour": "timestamptz",
    "day": "timestamptz",
    "tier_1": "text",
    "tier_2": "text",
    **{f"{name}_{slot}": "numeric" for slot in (1, 2) for name in ROLLUP_SUMS},
}
# Columns JSON has no type for: sent as their exact text (str() of a Decimal or of an
# aware datetime), which PostgreSQL's casts read back exactly.
AS_TEXT = frozenset(
    name for name, kind in COLUMN_TYPES.items() if kind in ("numeric", "timestamptz")
)


def json_columns(rows: list[tuple], fields: tuple[str, ...]) -> str:
    """The rows' leading `fields` as one JSON array per column. A tick's values repeat,
    so each distinct Decimal or datetime becomes text once; `json` then encodes the tick
    in C (typed arrays would cost psycopg a Python call per element)."""
    columns = []
    for name, values in zip(fields, zip(*rows, strict=True), strict=False):
        if name in AS_TEXT:
            text = {v: None if v is None else str(v) for v in set(values)}
            values = [text[v] for v in values]
        columns.append(values)
    return json.dumps(columns)


def json_rows_sql(fields: tuple[str, ...], *, numbered: bool = False) -> str:
    """A FROM item reading `json_columns(rows, fields)` (one parameter) back as typed
    rows: the arrays are read in step (ROWS FROM zips set functions). `numbered` adds
    each row's 0-based position as `n`."""
    elements = ", ".join(f"jsonb_array_elements_text(d.j -> {n})" for n in range(len(fields)))
    typed = ", ".join(f"c.{name}::{COLUMN_TYPES[name]} AS {name}" for name in fields)
    rows_from, names = f"ROWS FROM ({elements})", ", ".join(fields)
    if numbered:
        rows_from, names, typed = (
            f"{rows_from} WITH ORDINALITY",
            f"{names}, n",
            f"{typed}, c.n - 1 AS n",
        )
    # Our own column names and types only; the values are the parameter.
    return f"(SELECT {typed} FROM (SELECT %s::jsonb AS j) AS d, {rows_from} AS c({names}))"  # noqa: S608


def fetch_rows(queryset) -> list[tuple]:
    """The rows of a `values_list` queryset. On PostgreSQL they are read through psycopg's
    C timestamptz loader: Django's is a Python subclass, and a big tick reads some 30,000
    datetimes."""
    if connection.vendor != "postgresql":
        return list(queryset)
    sql, params = queryset.query.sql_with_params()
    with binary_cursor() as cursor:
        # Registering psycopg's Python class picks its C twin; the session's time zone
        # is UTC (Django sets it), so the values are UTC-aware like Django's.
        cursor.cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        cursor.execute(sql, params)
        return cursor.fetchall()


@contextmanager
def binary_cursor():
    """A psycopg `Cursor` binding parameters on the server in binary, rather than Django's
    client-side binding, which quotes every array element in Python: over twice as fast
    for a tick's arrays."""
    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    # Django's wrappers: query logging (tests count queries) and error translation.
    if connection.queries_logged:
        cursor = connection.make_debug_cursor(raw)
    else:
        cursor = connection.make_cursor(raw)
    try:
        yield cursor
    finally:
        cursor.close()
