"""The console's palette keeps WCAG AA contrast (4.5:1, badges are small text) in both
colour schemes: each text colour on each background, and each fill behind its text.

axe checks the pages the browser tests visit, in the colours those pages happen to show;
this checks every colour of static/css/app.css, whatever page uses it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

STYLESHEET = Path(__file__).resolve().parents[2] / "static" / "css" / "app.css"
AA_NORMAL_TEXT = 4.5
TEXT_COLOURS = ("--text", "--muted", "--primary", "--danger", "--ok", "--warn")
BACKGROUNDS = ("--bg", "--surface")
# A fill and the text drawn on it (buttons, the current nav item, the unread count).
FILLS = (("--primary", "--primary-text"), ("--danger-strong", "#fff"))


def palettes() -> dict[str, dict[str, str]]:
    css = STYLESHEET.read_text()
    blocks = re.findall(r":root\s*\{([^}]*)\}", css)
    light = dict(re.findall(r"(--[\w-]+):\s*(#[0-9a-fA-F]{3,6})\b", blocks[0]))
    dark_media = re.search(r"prefers-color-scheme:\s*dark\)\s*\{\s*:root\s*\{([^}]*)\}", css)
    assert dark_media, "the dark scheme's :root block is missing"
    dark = {**light, **dict(re.findall(r"(--[\w-]+):\s*(#[0-9a-fA-F]{3,6})\b", dark_media[1]))}
    return {"light": light, "dark": dark}


def luminance(colour: str) -> float:
    digits = colour.lstrip("#")
    if len(digits) == 3:
        digits = "".join(d * 2 for d in digits)
    channels = [int(digits[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_contrast_formula_matches_wcag_examples():
    assert contrast("#000", "#fff") == pytest.approx(21)
    # The "Spot" and "Paused" badges before this check: the old --warn on --bg.
    assert contrast("#e67700", "#f6f7f9") == pytest.approx(2.8, abs=0.01)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_text_colour_reads_on_every_background(scheme):
    palette = palettes()[scheme]
    too_faint = [
        f"{text} {palette[text]} on {background} {palette[background]}: "
        f"{contrast(palette[text], palette[background]):.2f}"
        for text in TEXT_COLOURS
        for background in BACKGROUNDS
        if contrast(palette[text], palette[background]) < AA_NORMAL_TEXT
    ]
    assert not too_faint, f"below {AA_NORMAL_TEXT}:1 in the {scheme} scheme: {too_faint}"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_text_on_filled_buttons_reads(scheme):
    palette = palettes()[scheme]
    for fill, text in FILLS:
        ratio = contrast(palette[fill], palette.get(text, text))
        assert ratio >= AA_NORMAL_TEXT, f"{text} on {fill} in the {scheme} scheme: {ratio:.2f}"
