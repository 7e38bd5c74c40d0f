"""What every chart of the console shares: the colours (one per GPU type on every page,
a distinct one per GPU on a job's charts), the rule that says a figure has nothing to
draw (its page shows a sentence instead of empty axes), and the axis settings that keep
labels from being cut off.

Figures are plain Plotly JSON (`{"data": [...], "layout": {...}}`) built on the server;
static/js/charts.js draws them and adds each chart's table view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Okabe–Ito and Tableau hues that stay apart for colour-blind readers, in a fixed order:
# a GPU type keeps its colour as long as it exists (see marketplace.selectors
# .gpu_type_colours, which hands them out by the type's creation order).
GPU_TYPE_PALETTE = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#cc79a7",
    "#d55e00",
    "#56b4e9",
    "#8c564b",
    "#b8a000",
    "#7f3c8d",
    "#3969ac",
    "#e73f74",
    "#11a579",
)
CPU_COLOUR = "#7f7f7f"

# A job's charts draw at most this many per-GPU lines; above it, the mean with a
# min–max band (each GPU on demand).
PER_GPU_LINES_MAX = 8
# One colour per GPU index on a node, one dash per node: 8 GPUs × several nodes stay apart.
GPU_LINE_PALETTE = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#cc79a7",
    "#d55e00",
    "#56b4e9",
    "#000000",
    "#b8a000",
)
NODE_DASHES = ("solid", "dot", "dash", "longdash", "dashdot", "longdashdot")


def palette_colour(index: int) -> str:
    return GPU_TYPE_PALETTE[index % len(GPU_TYPE_PALETTE)]


def translucent(colour: str, alpha: float) -> str:
    """`#rrggbb` as `rgba(r, g, b, alpha)` (a band under a line of the same colour)."""
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red}, {green}, {blue}, {alpha})"


def _values(trace: Mapping) -> Iterable:
    if trace.get("type") == "pie":
        return trace.get("values") or ()
    axis = "x" if trace.get("orientation") == "h" else "y"
    return trace.get(axis) or ()


def has_points(figure: Mapping | None) -> bool:
    """Whether a figure draws anything: a trace with a value other than 0 or missing.
    A figure without is shown as its empty-state sentence, never as bare axes (plotly.js
    draws an empty date axis as Jan 2000 and an empty linear one as -1 to 4)."""
    if not figure:
        return False
    return any(value not in (None, 0) for trace in figure["data"] for value in _values(trace))


def fit_axes(layout: dict) -> dict:
    """Every axis grows the margin its tick labels and title need (Plotly's `automargin`),
    so a long job name or a month label is never cut at the chart's edge."""
    for name in ("xaxis", "yaxis"):
        layout.setdefault(name, {})
    for name, axis in layout.items():
        if name.startswith(("xaxis", "yaxis")) and isinstance(axis, dict):
            axis.setdefault("automargin", True)
    return layout
