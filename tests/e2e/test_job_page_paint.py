"""The job page paints before plotly.js runs: the library (1 MB of script) is preloaded
and run after the first paint, then draws the charts (its first paint is measured by
`make bench`: tests/bench/pages/bench_job_page.py)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from jobs.backends.local import LocalBackend
from jobs.models import JobStatus
from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync
from tests.conftest import signed_in_client
from tests.jobs_helpers import advance_to, submit

pytestmark = pytest.mark.e2e


def test_plotly_runs_after_the_first_paint_and_the_charts_still_load(
    browser_page, asgi_server, world
):
    seed_catalog()
    capacity_sync(backend=LocalBackend())
    job = advance_to(submit(world, "paint", region="local"), JobStatus.RUNNING)
    session = signed_in_client(world.member, world.tenant).cookies["sessionid"].value
    page = browser_page
    page.context.add_cookies([{"name": "sessionid", "value": session, "url": asgi_server.url}])

    page.goto(f"/jobs/{job.pk}/")
    # Not a parser-run script: fetched early, run once the page has painted.
    assert page.locator("script[src*='plotly']").count() <= 1
    assert page.locator("link[rel=preload][href*='plotly'][as=script]").count() == 1
    page.wait_for_function("typeof window.Plotly !== 'undefined'", timeout=10_000)
    ran = page.evaluate(
        """() => {
          const paint = performance.getEntriesByType("paint")
            .find((e) => e.name === "first-contentful-paint");
          const script = document.querySelector("script[src*='plotly']");
          const injected = Boolean(script) && !script.hasAttribute("defer");
          return { paint: paint && paint.startTime, injected };
        }"""
    )
    assert ran["paint"] and ran["injected"], ran
    expect(page.get_by_test_id("metrics-note")).not_to_contain_text("need plotly.js")
    expect(page.get_by_test_id("live-state")).to_have_attribute("data-state", "open")
    page.problems.assert_clean()
