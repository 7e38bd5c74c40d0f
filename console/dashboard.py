"""The dashboard's sections come from the rooms above the console (jobs, billing…),
which register a context function here from `AppConfig.ready()`; the console never
imports them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

DashboardSection = Callable[[HttpRequest], dict[str, Any]]
_sections: dict[DashboardSection, int] = {}


def dashboard_section_register(section: DashboardSection, *, position: int = 100) -> None:
    """Sections' panels are shown by `position` (lowest first: alerts, then money)."""
    _sections[section] = position


def dashboard_sections_context(request: HttpRequest) -> dict[str, Any]:
    """The template context every registered section adds for this request; their
    `dashboard_panels` (template names) add up."""
    context: dict[str, Any] = {}
    panels: list[str] = []
    for section in sorted(_sections, key=_sections.__getitem__):
        added = section(request)
        panels += added.pop("dashboard_panels", [])
        context.update(added)
    if panels:
        context["dashboard_panels"] = panels
    return context
