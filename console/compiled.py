"""ORM queries compiled once per process, then run with other values.

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
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.db import connection, models
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

    def of_field(self, name: str, model_field: models.Field) -> Any:
        """A stand-in for a value of `model_field`."""
        if isinstance(model_field, models.DateTimeField):
            return self.datetime(name)
        if isinstance(model_field, models.IntegerField | models.AutoField | models.ForeignKey):
            return self.int(name)
        return self.text(name)


class GivenValues(StandIns):
    """The real values where the stand-ins would go: `build(GivenValues(values))` is the
    query as the ORM would run it, uncompiled."""

    def __init__(self, given: Mapping[str, Any]) -> None:
        super().__init__()
        self.given = given

    def _add(self, name: str, value: Any) -> Any:
        return self.given[name]


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

    def rows(self, *, window: tuple[int, int] | None = None, **values: Any) -> list[tuple]:
        """The query's rows for `values` (one per stand-in name), columns converted;
        `window` (offset, limit): that slice of them."""
        sql, params = self.sql, self._params(values)
        if window is not None:  # as Django writes a slice, on PostgreSQL and SQLite alike
            sql, params = f"{sql} LIMIT %s OFFSET %s", [*params, window[1], window[0]]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if self.converters:
            rows = [self._convert(list(row)) for row in rows]
        return rows

    def count(self, *, at_most: int, **values: Any) -> int:
        """How many rows for `values`, counting at most `at_most` (as a sliced count)."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM ({self.sql} LIMIT %s) counted",  # noqa: S608 (the ORM's SQL)
                [*self._params(values), at_most],
            )
            return cursor.fetchone()[0]

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


def compiled_first(
    key: Hashable, model: type[ModelT], build: Callable[[StandIns], QuerySet], **values: Any
) -> ModelT | None:
    """`build(…).first()` as an instance of `model`, compiled once (see `compiled`)."""

    def first(at: StandIns) -> QuerySet:
        queryset = build(at)
        return (queryset if queryset.ordered else queryset.order_by("pk"))[:1]  # as first()

    found = compiled_instances((key, "first"), model, first, **values)
    return found[0] if found else None


def compiled_joined(
    key: Hashable,
    parts: tuple[tuple[type[Model], str], ...],
    build: Callable[[StandIns], QuerySet],
    **values: Any,
) -> list[tuple[Any, ...]]:
    """`build(…)`'s rows as one instance per (model, path) of `parts`: the queryset's
    own model first (path ""), then each joined one by its path from it (e.g.
    "tenant__"); compiled once (see `compiled`). Linking them is the caller's."""
    names = [[column.attname for column in model._meta.concrete_fields] for model, _ in parts]
    paths = [f"{path}{name}" for (_, path), own in zip(parts, names, strict=True) for name in own]
    rows = compiled((key, "joined"), lambda at: build(at).values_list(*paths)).rows(**values)
    joined = []
    for row in rows:
        instances, start = [], 0
        for (model, _), own in zip(parts, names, strict=True):
            instances.append(model.from_db(connection.alias, own, row[start : start + len(own)]))
            start += len(own)
        joined.append(tuple(instances))
    return joined


@dataclass(frozen=True)
class CompiledValues:
    """The rows of a `.values()` query, compiled once per shape (see `compiled`), that a
    pager takes in place of the queryset: DRF's CursorPagination (`order_by`, a filter on
    its ordering column's position, a slice) and Django's Paginator (an ordered slice).
    `console.paging.capped_count` counts its `scope`; anything else: `queryset()`.

    A long list's page (the jobs API and page) otherwise compiled its query, and its
    count's, on every request: a fifth of the page's time."""

    # What, besides the stand-ins' values, changes the query (e.g. which filters apply).
    key: Hashable
    model: type[Model]
    # Which rows (the tenant's, filtered): what a count counts.
    scope: Callable[[StandIns], QuerySet]
    # What a row reads: the `.values()` (and annotations) over `scope`.
    shape: Callable[[QuerySet], QuerySet]
    values: Mapping[str, Any] = field(default_factory=dict)
    ordering: tuple[str, ...] = ()
    # A cursor's position: (column, "lt" or "gt", value).
    position: tuple[str, str, Any] | None = None

    @property
    def ordered(self) -> bool:
        return bool(self.ordering)

    def order_by(self, *ordering: str) -> CompiledValues:
        return replace(self, ordering=ordering)

    def filter(self, **lookup: Any) -> CompiledValues:
        (name, value), *more = lookup.items()
        column, _, operator = name.rpartition("__")
        if more or operator not in ("lt", "gt") or self.position is not None:
            raise TypeError(f"compiled rows take one position filter, not {lookup!r}")
        return replace(self, position=(column, operator, value))

    def queryset(self) -> QuerySet:
        """The same rows as an ordinary queryset (uncompiled)."""
        at = GivenValues({**self.values, **self._position_value()})
        return self._build(at)

    def __getitem__(self, window: slice) -> list[dict[str, Any]]:
        start, stop = window.start or 0, window.stop
        if stop is None or window.step not in (None, 1) or start < 0 or stop < start:
            return list(self.queryset()[window])
        shape = (self.key, self.ordering, self.position and self.position[:2])
        query = compiled(shape, self._build)
        rows = query.rows(window=(start, stop - start), **self.values, **self._position_value())
        return [dict(zip(query.columns, row, strict=True)) for row in rows]

    def count(self, *, at_most: int) -> int:
        """How many rows `scope` has, counting at most `at_most`."""
        query = compiled((self.key, "count"), lambda at: self.scope(at).order_by().values("pk"))
        return query.count(at_most=at_most, **self.values)

    def _build(self, at: StandIns) -> QuerySet:
        rows = self.shape(self.scope(at))
        if self.ordering:
            rows = rows.order_by(*self.ordering)
        if self.position is not None:
            column, operator, _ = self.position
            value = at.of_field("position", self.model._meta.get_field(column))
            rows = rows.filter(**{f"{column}__{operator}": value})
        return rows

    def _position_value(self) -> dict[str, Any]:
        if self.position is None:
            return {}
        column, _, value = self.position
        return {"position": self.model._meta.get_field(column).get_prep_value(value)}
