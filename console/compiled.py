"""ORM queries compiled once per process, then run with other values.

Left for admission only (jobs.services.admission), whose rewrite on the job row removes
its use; this module goes with it.

Django compiles a query every time it runs it. On a hot path (every API request's token
lookup, every launch's admission), compiling took longer than the database took to run
the query. Such a query is still written with the ORM, once, with stand-in values
(`StandIns`) where the request's values go; it is compiled once per process, database
and `key` (what changes its shape, e.g. the length of an IN list), and each run puts the
real values where the stand-ins were and converts the columns as the ORM would, on the
running thread's connection.

Per process, not per thread: under ASGI every request's sync code runs in a thread of
its own (Django gives each request its own thread-sensitive context), so a per-thread
cache compiled every query again on every request.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model, QuerySet

ModelT = TypeVar("ModelT", bound=Model)
# Far from any real id or time, so a stand-in is never mistaken for another parameter.
_FIRST_INT = -(10**15)
_FIRST_TIME = datetime(1901, 1, 1, tzinfo=UTC)


class StandIns:
    """Values a query is built with in place of the real ones, one per name."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def _add(self, name: str, value: Any) -> Any:
        self.values[name] = value
        return value

    def int(self, name: str) -> int:
        return self._add(name, _FIRST_INT - len(self.values))

    def text(self, name: str) -> str:
        return self._add(name, f"\x00{name}\x00")

    def datetime(self, name: str) -> datetime:
        return self._add(name, _FIRST_TIME + timedelta(microseconds=len(self.values) + 1))


@dataclass(frozen=True)
class CompiledQuery:
    sql: str
    params: tuple[Any, ...]
    # Where each value goes: (parameter index, name, adapt it as a datetime).
    slots: tuple[tuple[int, str, bool], ...]
    # Per column position: the ORM's converters and the expression they take.
    converters: tuple[tuple[int, tuple[list, Any]], ...]
    columns: tuple[str, ...]

    def first(self, **values: Any) -> dict[str, Any] | None:
        """The first row for `values`, by column name, or None."""
        rows = self.rows(**values)
        return dict(zip(self.columns, rows[0], strict=True)) if rows else None

    def rows(self, **values: Any) -> list[tuple]:
        """The query's rows for `values` (one per stand-in name), columns converted."""
        with connection.cursor() as cursor:
            cursor.execute(self.sql, self._params(values))
            rows = cursor.fetchall()
        if self.converters:
            rows = [self._convert(list(row)) for row in rows]
        return rows

    def _params(self, values: Mapping[str, Any]) -> list:
        params = list(self.params)
        for index, name, as_datetime in self.slots:
            value = values[name]
            params[index] = (
                connection.ops.adapt_datetimefield_value(value) if as_datetime else value
            )
        return params

    def _convert(self, row: list) -> tuple:
        # SQLCompiler.apply_converters, with this thread's connection.
        for position, (converters, expression) in self.converters:
            value = row[position]
            for converter in converters:
                value = converter(value, expression, connection)
            row[position] = value
        return tuple(row)


# (database alias, vendor, key) -> its compiled query. Filled under the GIL: two threads
# compiling the same query at once both store an equal result.
_kept: dict[tuple, CompiledQuery] = {}


def compiled(key: Hashable, build: Callable[[StandIns], QuerySet]) -> CompiledQuery:
    """The query `build` writes, compiled for the current database connection's vendor."""
    full_key = (connection.alias, connection.vendor, key)
    found = _kept.get(full_key)
    if found is not None:
        return found
    stand_ins = StandIns()
    compiler = build(stand_ins).query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    slots = []
    for name, value in stand_ins.values.items():
        adapted = (
            connection.ops.adapt_datetimefield_value(value)
            if isinstance(value, datetime)
            else value
        )
        places = [
            (index, name, param is not value and param == adapted)
            for index, param in enumerate(params)
            if param is value or (type(param) is type(adapted) and param == adapted)
        ]
        if not places:
            raise ValueError(f"{name!r} is not a parameter of the compiled query: {sql}")
        slots.extend(places)
    converters = compiler.get_converters([column[0] for column in compiler.select])
    query = compiler.query
    if query.selected:  # a .values() query: its names, as ValuesIterable reads them
        columns = tuple(query.selected)
    elif query.values_select:
        columns = (*query.extra_select, *query.values_select, *query.annotation_select)
    else:
        columns = tuple(alias or "" for _, _, alias in compiler.select)
    found = CompiledQuery(sql, tuple(params), tuple(slots), tuple(converters.items()), columns)
    _kept[full_key] = found
    return found


def compiled_instances(
    key: Hashable, model: type[ModelT], build: Callable[[StandIns], QuerySet], **values: Any
) -> list[ModelT]:
    """`list(build(…))` as instances of `model` (its own columns, no related objects),
    compiled once (see `compiled`)."""
    names = [field.attname for field in model._meta.concrete_fields]
    rows = compiled((key, "rows"), lambda at: build(at).values_list(*names)).rows(**values)
    return [model.from_db(connection.alias, names, row) for row in rows]
