"""Chart helpers for templates: `{% if figure|has_points %}` draws the chart, else the
page's empty-state sentence (console.charts.has_points)."""

from __future__ import annotations

from django import template

from console import charts

register = template.Library()


@register.filter
def has_points(figure) -> bool:
    return charts.has_points(figure)
