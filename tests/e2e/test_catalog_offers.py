"""The catalog's offers page in a browser: offers grouped by GPU type × region with the
tiers side by side and the spot saving, available groups first, the compact toggle kept
in the address, "Launch this" links to the prefilled launch form, no duplicate ids, and
nothing wider than a 390 px phone screen."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from playwright.sync_api import expect

from marketplace.models import NodePool, Tier
from tests.conftest import catalog_seed
from tests.e2e.test_launch_job import sign_in
from tests.e2e.test_sandbox_journeys import screenshot

pytestmark = pytest.mark.e2e

DUPLICATE_IDS = """() => {
  const seen = {};
  for (const el of document.querySelectorAll('[id]')) seen[el.id] = (seen[el.id] || 0) + 1;
  return Object.keys(seen).filter((id) => seen[id] > 1);
}"""
# Elements drawn past the viewport's right edge (the visually-hidden 1 px ones aside).
TOO_WIDE = """(width) => [...document.querySelectorAll('body *')]
  .filter((el) => {
    const r = el.getBoundingClientRect();
    return r.width > 1 && r.right > width + 0.5;
  })
  .map((el) => el.tagName + (el.id ? '#' + el.id : '') + '.' + el.className)"""
GROUPS = """() => [...document.querySelectorAll('[data-testid=offers-table] tbody tr')]
  .map((tr) => ({
  group: tr.dataset.group,
  available: !tr.classList.contains('unavailable'),
  prices: [...tr.querySelectorAll('.offer-price')].map((p) => p.textContent.trim()),
}))"""

# WCAG 2 contrast of each badge's text against its own (opaque) background.
BADGE_CONTRASTS = """() => {
  const lum = (css) => {
    const [r, g, b] = css.match(/[\\d.]+/g).slice(0, 3).map((v) => {
      const c = Number(v) / 255;
      return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  return [...document.querySelectorAll('#offers-table .badge')].map((el) => {
    const style = getComputedStyle(el);
    const [a, b] = [lum(style.color), lum(style.backgroundColor)].sort((x, y) => y - x);
    return [el.textContent.trim(), (a + 0.05) / (b + 0.05)];
  });
}"""


def price(text: str) -> Decimal:
    return Decimal(text.split()[0].replace(",", ""))


def test_catalog_groups_offers_and_fits_a_phone(browser_page, asgi_server, world, password):
    page, base = browser_page, asgi_server.url
    journey = "catalog"
    catalog_seed()
    sign_in(page, base, world.member.email, password)
    page.goto("/marketplace/offers/")

    # One row per GPU type × region, its tiers side by side, spot's saving beside it.
    a100 = page.locator("[data-testid=offers-table] tr[data-group='a100-80gb|us-west']")
    for tier in ("on_demand", "spot", "reserved"):
        expect(a100.locator(f"[data-offer='a100-80gb|us-west|{tier}']")).to_have_count(1)
    expect(a100.get_by_test_id("spot-saving")).to_have_text("Save 55 %")
    expect(a100.locator("[data-offer$='|on_demand'] .offer-price")).to_have_text("1.7900 USD")

    # Available groups first, then by their cheapest tier.
    groups = page.evaluate(GROUPS)
    assert len(groups) == len({g["group"] for g in groups}) < 60
    flags = [g["available"] for g in groups]
    assert flags == sorted(flags, reverse=True) and flags[0] and not flags[-1]
    cheapest = [min(price(p) for p in g["prices"]) for g in groups if g["available"]]
    assert cheapest == sorted(cheapest)
    contrasts = page.evaluate(BADGE_CONTRASTS)
    assert {text for text, _ in contrasts} >= {"Save 55 %"}
    assert all(ratio >= 4.5 for _, ratio in contrasts), contrasts
    default_height = page.evaluate("document.documentElement.scrollHeight")
    screenshot(page, journey, "1-grouped")

    # "Launch this" opens the launch form for that tier, GPU, region and node size.
    pool = NodePool.objects.filter(
        gpu_type__slug="a100-80gb", region__slug="us-west", tier=Tier.SPOT, is_active=True
    ).first()
    assert pool is not None
    launch = a100.locator("[data-offer='a100-80gb|us-west|spot']").get_by_role(
        "link", name=re.compile("^Launch this")
    )
    expect(launch).to_have_attribute(
        "href",
        "/jobs/launch/?gpu_type=a100-80gb&region=us-west&tier=spot"
        f"&gpus_per_node={pool.gpus_per_node}",
    )
    expect(launch).to_have_accessible_name("Launch this: A100 80GB SXM in US West (Oregon), Spot")

    # The compact toggle is kept in the address: a reload keeps it.
    filters = page.locator("form.filters")
    with page.expect_response(lambda r: "compact=on" in r.url):
        filters.get_by_label("Compact view").check()
    expect(page.locator("#offers-table")).to_have_attribute("data-compact", "on")
    expect(page).to_have_url(re.compile(r"compact=on"))
    page.reload()
    expect(filters.get_by_label("Compact view")).to_be_checked()
    compact_height = page.evaluate("document.documentElement.scrollHeight")
    assert compact_height < default_height
    print(f"offers page height: {default_height} px, compact {compact_height} px")
    screenshot(page, journey, "2-compact")

    # Filters narrow the groups (the GPU type filter has its own ids, apart from the
    # estimate form's).
    with page.expect_response(lambda r: "gpu_type=h100-80gb" in r.url):
        filters.get_by_label("GPU type").select_option("h100-80gb")
    rows = page.locator("[data-testid=offers-table] tbody tr")
    expect(rows.first).to_have_attribute("data-group", re.compile(r"^h100-80gb\|"))
    assert all(g["group"].startswith("h100-80gb|") for g in page.evaluate(GROUPS))
    assert page.evaluate(DUPLICATE_IDS) == []

    # A phone: nothing wider than the screen, in both modes.
    page.set_viewport_size({"width": 390, "height": 844})
    for address in ("/marketplace/offers/", "/marketplace/offers/?compact=on"):
        page.goto(address)
        expect(a100).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert page.evaluate(TOO_WIDE, 390) == []
        assert page.evaluate(DUPLICATE_IDS) == []
    # Stacked, each cell still says which tier it is.
    spot_cell = a100.locator("[data-offer='a100-80gb|us-west|spot']")
    assert spot_cell.evaluate("el => getComputedStyle(el, '::before').content") == '"Spot"'
    screenshot(page, journey, "3-phone-compact")
    page.problems.assert_clean()
