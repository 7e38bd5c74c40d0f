"""CSV exports that a spreadsheet opens as data, never as formulas (CSV injection).

A cell a tenant can influence (a job, project or region name) that starts with `=`, `+`,
`-`, `@`, a tab or a carriage return is run as a formula by Excel, LibreOffice and Google
Sheets; OWASP's advice is to prefix such a cell with `'`, which the spreadsheet shows as
text. Every CSV the console serves goes through `csv_writer` (or `csv_safe`).

Numbers: a cell given as an `int`, `float` or `Decimal` is one we produced, so it is
written as is, and a negative amount (a credit such as -12.50) stays numeric in the
spreadsheet. A *string* is never trusted to be a number, even if it looks like one
(`-1+cmd|' /C calc'!A0` starts like one): it is prefixed by the rule above. So code that
exports a figure passes the number, not its formatted text.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value: Any) -> Any:
    """The value as it may go into a CSV cell: numbers as they are, text neutralised."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float | Decimal):
        return value
    text = str(value)
    if text.startswith(FORMULA_PREFIXES):
        return "'" + text
    return text


class SafeCsvWriter:
    """`csv.writer` whose every row goes through `csv_safe`."""

    def __init__(self, stream, **kwargs) -> None:
        self._writer = csv.writer(stream, **kwargs)

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._writer.writerow([csv_safe(value) for value in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def csv_writer(stream, **kwargs) -> SafeCsvWriter:
    return SafeCsvWriter(stream, **kwargs)
