"""Charts in a browser (issue 32, item 8): a sentence instead of bare axes where there is
nothing to draw, a 16-GPU job as a mean with a min–max band (each GPU on demand), markers
for its pause and resume, the value chart's two labelled axes, one colour per GPU type,
and every chart's table view."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from jobs import metrics
from jobs.backends.base import GpuReading
from jobs.models import JobStatus
from marketplace.demo import seed_catalog
from marketplace.models import GpuType
from tests.e2e.test_cost_explorer import CHART_TIMEOUT_MS, seed_usage, sign_in
from tests.e2e.test_sandbox_journeys import screenshot
from tests.jobs.test_consumers import make_job
from tests.jobs_helpers import advance_to

pytestmark = pytest.mark.e2e

VISIBLE_METAS = """div => div.data.filter(t => t.visible !== false).map(t => t.meta)"""


def test_cost_explorer_says_when_empty_then_charts_with_tables(
    browser_page, asgi_server, world, password, monkeypatch
):
    page, base = browser_page, asgi_server.url
    sign_in(page, base, world.member.email, password)
    page.goto("/billing/costs/")
    expect(page.get_by_test_id("chart-daily-empty")).to_contain_text("No cost in this range")
    expect(page.get_by_test_id("chart-top-empty")).to_be_visible()
    # No axes at all (plotly.js drew Jan 2000 and -1…4 on empty ones).
    expect(page.locator(".js-plotly-plot")).to_have_count(0)

    seed_usage(world, monkeypatch)
    page.reload()
    daily = page.get_by_test_id("chart-daily")
    expect(daily.locator(".main-svg").first).to_be_visible(timeout=CHART_TIMEOUT_MS)
    block = page.locator("[data-chart-block]").filter(has=daily)
    toggle = block.locator("[data-chart-table-toggle]")
    expect(toggle).to_have_text("Show as table")
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    table = block.get_by_role("table")
    expect(table.locator("caption")).to_have_text("Daily cost by GPU type")
    expect(table.locator("thead th")).to_contain_text(["Date", "H100 80GB SXM (USD)"])
    assert table.locator("tbody tr").count() >= 1
    expect(toggle).to_have_text("Hide table")
    toggle.click()
    expect(table).to_be_hidden()

    # The value chart: each unit on its own labelled axis.
    value = page.get_by_test_id("chart-value")
    expect(value.locator(".g-ytitle")).to_have_text("USD / GPU-hour", timeout=CHART_TIMEOUT_MS)
    expect(value.locator(".g-y2title")).to_have_text("USD / PFLOP-hour")
    # One colour per GPU type: H100's daily bars and its value bars match.
    daily_colour = daily.evaluate(
        "div => div.data.find(t => t.name === 'H100 80GB SXM').marker.color"
    )
    value_colour = value.evaluate(
        "div => div.data[0].marker.color[div.data[0].x.indexOf('H100 80GB SXM')]"
    )
    assert daily_colour == value_colour
    # Top jobs: each name whole, inside the chart.
    top = page.get_by_test_id("chart-top")
    expect(top.locator(".ytick text")).to_contain_text(["bert-large #"], timeout=CHART_TIMEOUT_MS)
    label_box = top.locator(".ytick text").first.bounding_box()
    chart_box = top.bounding_box()
    assert label_box and chart_box and label_box["x"] >= chart_box["x"]
    screenshot(page, "charts", "1-cost-explorer")
    page.problems.assert_clean()


def test_sixteen_gpu_job_band_per_gpu_view_markers_and_empty_state(
    browser_page, asgi_server, world, password
):
    page, base = browser_page, asgi_server.url
    seed_catalog()
    a100 = GpuType.objects.get(slug="a100-80gb")
    job = make_job(
        world.tenant,
        name="band",
        gpu_type=a100,
        gpus_per_node=8,
        nodes=2,
        backend="kubernetes",
    )
    advance_to(job, JobStatus.PAUSED)
    advance_to(job, JobStatus.RUNNING)  # through resuming: a "Resumed" marker
    now = timezone.now()
    for tick in range(3):
        metrics.metrics_record(
            job=job,
            at=now - timedelta(seconds=30 * (2 - tick)),
            readings=[
                GpuReading(node=f"rank {n}", gpu=g, utilization=float(10 * n + g + tick))
                for n in range(2)
                for g in range(8)
            ],
        )
    quiet = make_job(world.tenant, name="no readings", gpu_type=a100, gpus_per_node=1)
    sign_in(page, base, world.member.email, password)

    page.goto(f"/jobs/{job.pk}/")
    chart = page.locator("[data-chart=utilization]")
    expect(chart.locator(".main-svg").first).to_be_visible(timeout=CHART_TIMEOUT_MS)
    assert chart.evaluate(VISIBLE_METAS) == list(metrics.AGGREGATE_KEYS)
    screenshot(page, "charts", "2-sixteen-gpu-band")
    expect(chart.locator(".scatterlayer .js-fill")).to_have_count(1)  # the min–max band
    expect(chart.locator(".legendtext")).to_contain_text(["Highest GPU", "Mean of 16 GPUs"])
    expect(page.get_by_text("16 GPUs: the mean")).to_be_visible()
    # Markers for the pause and the resume, on every chart.
    for name in ("utilization", "power_w"):
        expect(page.locator(f"[data-chart={name}] .annotation-text")).to_have_text(
            ["Paused", "Resumed"]
        )

    page.get_by_role("button", name="Show each GPU").click()
    per_gpu = chart.evaluate(VISIBLE_METAS)
    assert len(per_gpu) == 16 and "rank 1/gpu7" in per_gpu
    page.get_by_role("button", name="Show the mean and range").click()
    assert chart.evaluate(VISIBLE_METAS) == list(metrics.AGGREGATE_KEYS)

    metrics_card = page.get_by_test_id("metrics")
    metrics_card.get_by_role("button", name="Show as table").first.click()
    table = metrics_card.get_by_role("table").first
    expect(table.locator("caption")).to_have_text("GPU utilisation")
    expect(table.locator("thead th")).to_have_text(
        ["Date", "Lowest GPU (%)", "Highest GPU (%)", "Mean of 16 GPUs (%)"]
    )
    expect(table.locator("tbody tr")).to_have_count(3)
    expect(table.locator("tbody tr").last.locator("td")).to_have_text(["2", "19", "10.5"])

    # A GPU job without readings: a sentence (here, why there are none), no axes.
    page.goto(f"/jobs/{quiet.pk}/")
    expect(page.get_by_test_id("metrics-note")).to_have_text(re.compile("no GPU readings", re.I))
    expect(page.locator("[data-metrics-charts]")).to_be_hidden()
    expect(page.locator(".js-plotly-plot")).to_have_count(0)
    page.problems.assert_clean()
