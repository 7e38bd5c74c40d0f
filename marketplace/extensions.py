"""Extension points for the apps above the marketplace (jobs, billing). The marketplace
never imports them: they register here from `AppConfig.ready()`.

- Price book panels: extra sections on the staff price book page (billing's "Usage
  without a price").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Panel:
    """A section to render on a page: a template and its context."""

    template_name: str
    context: dict[str, Any] = field(default_factory=dict)


# A provider returns its panel, or None when it has nothing to show right now.
PanelProvider = Callable[[], Panel | None]

_price_book_panels: dict[str, PanelProvider] = {}


def price_book_panel_register(name: str, provider: PanelProvider) -> None:
    """Add (or replace, by name: `ready()` may run more than once) a price book panel."""
    _price_book_panels[name] = provider


def price_book_panels() -> list[Panel]:
    """The panels to show on the staff price book page, in registration order."""
    panels = (provider() for provider in _price_book_panels.values())
    return [panel for panel in panels if panel is not None]
