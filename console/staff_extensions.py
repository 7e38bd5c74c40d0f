"""Extension points of the staff's organisation pages, for the rooms above the console
(billing: month-to-date spend, balance due, credit, billing settings). The console never
imports them: they register here from `AppConfig.ready()`.

- Columns on the organisations list: a provider gets the tenants of the page at once
  (so it reads them in a few queries, not a few per row) and returns each one's cells.
- Panels on an organisation's page: a template and its context, or None.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest

if TYPE_CHECKING:
    from console.models import Tenant


@dataclass(frozen=True)
class StaffColumn:
    label: str
    numeric: bool = False  # right-aligned


# tenant id → one display text per column of its provider (a missing tenant: empty cells).
StaffCells = Callable[[Sequence["Tenant"]], Mapping[int, Sequence[str]]]


@dataclass(frozen=True)
class StaffColumns:
    columns: tuple[StaffColumn, ...]
    cells: StaffCells


@dataclass(frozen=True)
class StaffPanel:
    """A section of an organisation's staff page: a template and its context."""

    template_name: str
    context: dict[str, Any] = field(default_factory=dict)


StaffPanelProvider = Callable[[HttpRequest, "Tenant"], StaffPanel | None]

_columns: dict[str, StaffColumns] = {}
_panels: dict[str, StaffPanelProvider] = {}


def staff_columns_register(name: str, columns: StaffColumns) -> None:
    """Add (or replace, by name: `ready()` may run more than once) list columns."""
    _columns[name] = columns


def staff_panel_register(name: str, provider: StaffPanelProvider) -> None:
    """Add (or replace, by name) a panel of the organisation page."""
    _panels[name] = provider


def staff_column_headers() -> list[StaffColumn]:
    return [column for group in _columns.values() for column in group.columns]


@dataclass(frozen=True)
class StaffCell:
    text: str
    numeric: bool


def staff_tenant_cells(tenants: Sequence[Tenant]) -> dict[int, list[StaffCell]]:
    """Every registered column's cells for these tenants, in registration order."""
    cells: dict[int, list[StaffCell]] = {tenant.pk: [] for tenant in tenants}
    for group in _columns.values():
        values = group.cells(tenants)
        for tenant in tenants:
            texts = list(values.get(tenant.pk, ()))
            texts += [""] * (len(group.columns) - len(texts))
            cells[tenant.pk] += [
                StaffCell(text=text, numeric=column.numeric)
                for column, text in zip(group.columns, texts, strict=False)
            ]
    return cells


def staff_panels(request: HttpRequest, tenant: Tenant) -> list[StaffPanel]:
    """The panels to show on the organisation's staff page, in registration order."""
    panels = (provider(request, tenant) for provider in _panels.values())
    return [panel for panel in panels if panel is not None]
