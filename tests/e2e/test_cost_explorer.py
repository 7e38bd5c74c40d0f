"""The Cost Explorer in a browser: plotly.js draws the server-built figures, and changing
"Group by" swaps the explorer through htmx and redraws the charts with the new groups."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import override_settings
from django.utils import timezone
from playwright.sync_api import expect

from billing.metering import meter_tick
from billing.selectors import period_start
from jobs.backends.local import LocalBackend
from jobs.models import JobStatus
from jobs.services import JobSpec, job_submit
from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync
from tests.billing.conftest import set_status
from tests.jobs_helpers import at_time

pytestmark = pytest.mark.e2e

CHART_TIMEOUT_MS = 15_000
# name: (GPU type, GPUs per node, spot ratio)
JOBS = {"bert-large": ("h100-80gb", 8, "0"), "sdxl-render": ("l40s", 2, "1"), "etl": (None, 0, "0")}


def seed_usage(world, monkeypatch) -> None:
    """Three jobs of this month, metered up to now; nothing is dispatched."""
    seed_catalog()
    capacity_sync(backend=LocalBackend())
    monkeypatch.setattr("console.queueing.enqueue_now", lambda *args: True)
    now = timezone.now()
    since = max(now - timedelta(hours=3), period_start(now))
    for name, (gpu_type, gpus, spot_ratio) in JOBS.items():
        # Submitted just before `since`, when it started running.
        with (
            override_settings(COMPUTE_BACKENDS=["kubernetes"]),
            at_time(since - timedelta(seconds=5)),
        ):
            job = job_submit(
                tenant=world.tenant,
                user=world.member,
                spec=JobSpec(
                    name=name,
                    image="pytorch-2-5-cuda12-4" if gpu_type else "python-3.11",
                    command=["python", "run.py"],
                    gpus_per_node=gpus,
                    gpu_type=gpu_type,
                    cpus=None if gpu_type else 2,
                    region="us-west",
                    spot_ratio=Decimal(spot_ratio),
                ),
            )
        set_status(job, JobStatus.RUNNING, since)
    meter_tick(now=now)


def sign_in(page, base_url: str, email: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.locator("input[name=username]").fill(email)
    page.locator("input[name=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{base_url}/")


def expect_legend(page, names: list[str]) -> None:
    """The daily chart's legend shows exactly these trace names (Plotly lists a stack's
    traces top first, so the order is not asserted)."""
    items = page.locator("[data-testid=chart-daily] .legend .legendtext")
    for name in names:
        expect(items.filter(has_text=name)).to_have_count(1, timeout=CHART_TIMEOUT_MS)
    expect(items).to_have_count(len(names))
    assert sorted(items.all_text_contents()) == sorted(names)


def test_charts_render_and_group_by_redraws_them(
    browser_page, asgi_server, world, password, monkeypatch
):
    page, base = browser_page, asgi_server.url
    seed_usage(world, monkeypatch)
    sign_in(page, base, world.member.email, password)

    page.goto("/billing/costs/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Cost Explorer")
    chart = page.locator("[data-testid=chart-daily]")
    # Plotly draws into the chart's own element, which it marks .js-plotly-plot.
    drawn = page.locator("[data-testid=chart-daily].js-plotly-plot .main-svg")
    expect(drawn.first).to_be_visible(timeout=CHART_TIMEOUT_MS)
    expect_legend(page, ["CPU", "H100 80GB SXM", "L40S 48GB"])  # display names, not slugs
    bars = chart.locator(".barlayer .trace")
    expect(bars).to_have_count(3)

    with page.expect_response(
        lambda r: "/billing/costs/" in r.url and "group_by=job" in r.url
    ) as swapped:
        page.get_by_label("Group by").select_option("job")
    assert swapped.value.status == 200
    assert swapped.value.request.headers.get("hx-request") == "true", "not sent by htmx"
    expect_legend(page, ["bert-large", "etl", "sdxl-render"])
    expect(page.get_by_role("heading", name="Daily cost by job")).to_be_visible()
    expect(page.get_by_test_id("cost-table").locator("tbody tr td:first-child")).to_have_text(
        ["bert-large", "etl", "sdxl-render"]
    )
    # The address follows the filters (hx-push-url), so a reload shows the same view.
    assert "group_by=job" in page.url
    page.reload()
    expect_legend(page, ["bert-large", "etl", "sdxl-render"])
    page.problems.assert_clean()
