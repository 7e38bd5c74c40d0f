"""The launch form offers only what exists, in a browser: choosing a GPU type moves the
region, GPUs per node and image to choices that exist and shows the free capacity and
the queue; a region with spot only sets the spot ratio; an offer's link and the
estimate's "Launch this" open the form filled in."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.conftest import catalog_seed
from tests.e2e.test_launch_job import sign_in
from tests.e2e.test_sandbox_journeys import screenshot

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster_pools_launchable(monkeypatch, settings):
    """The demo catalog's cluster pools are launchable (the kubernetes backend is
    configured), for this process and the web server started after it."""
    monkeypatch.setenv("COMPUTE_BACKENDS", "local,kubernetes")
    settings.COMPUTE_BACKENDS = ["local", "kubernetes"]


def test_choices_follow_the_gpu_type_and_links_prefill_the_form(
    cluster_pools_launchable, browser_page, asgi_server, world, password
):
    page, base = browser_page, asgi_server.url
    catalog_seed()
    sign_in(page, base, world.member.email, password)

    page.goto("/jobs/launch/")
    gpus, region, image = (page.locator(f"#id_{n}") for n in ("gpus_per_node", "region", "image"))
    expect(gpus).to_have_value("0")
    expect(image).to_have_value("python-3.11")
    with page.expect_response(lambda r: "/jobs/launch/options/" in r.url):
        page.locator("#id_gpu_type").select_option("a100-80gb")
    # GPUs per node: a whole node of the pool, never 0; the region: one that has A100s.
    expect(gpus).to_have_value("8")
    expect(region).to_have_value("us-west")
    assert sorted(region.locator("option").all_inner_texts()) == [
        "EU Central (Frankfurt)",
        "US West (Oregon)",
    ]
    expect(image).to_have_value("cuda-12-4-runtime")  # the first made for NVIDIA GPUs
    capacity = page.get_by_test_id("launch-capacity")
    expect(capacity).to_contain_text("32 of 32 GPUs free")
    expect(capacity).to_contain_text("No queued job ahead of it. It can start now.")
    # The live estimate prices what the form now holds: 8 × 1.79 an hour.
    expect(page.get_by_test_id("estimate-hourly")).to_have_text("14.32 USD")

    # EU Central sells A100s on spot only: the spot ratio follows.
    with page.expect_response(lambda r: "/jobs/launch/options/" in r.url):
        region.select_option("eu-central")
    expect(page.locator("#id_spot_ratio")).to_have_value("1")
    expect(page.get_by_test_id("launch-split")).to_have_text("1 node: spot")
    expect(page.get_by_test_id("launch-notes")).to_contain_text("spot only")
    expect(capacity).to_contain_text("Spot:")
    screenshot(page, "launch-choices", "1-spot-only-region")

    # An offer's link (the catalog's "Launch this") opens the form filled in.
    page.goto("/jobs/launch/?gpu_type=l40s&region=us-west&tier=spot&gpus_per_node=2&count=3")
    expect(page.locator("#id_gpu_type")).to_have_value("l40s")
    expect(region).to_have_value("us-west")
    expect(gpus).to_have_value("2")
    expect(page.locator("#id_nodes")).to_have_value("3")
    expect(page.locator("#id_spot_ratio")).to_have_value("1")
    assert gpus.locator("option").all_inner_texts() == ["1", "2", "3", "4"]
    expect(page.get_by_test_id("launch-notes")).to_have_count(0)
    # A bad value is ignored, and the page says so.
    page.goto("/jobs/launch/?gpu_type=l4&region=us-west&count=lots")
    notes = page.get_by_test_id("launch-notes")
    expect(notes).to_contain_text("Ignored count=lots")
    expect(notes).to_contain_text("L4 24GB is not offered in US West (Oregon)")
    expect(region).to_have_value("us-east")

    # The estimate's "Launch this" carries its choices to the form.
    page.goto("/marketplace/estimate/")
    estimate = page.locator("#estimate-form")
    estimate.locator("[name=gpu_type]").select_option("h100-80gb")
    estimate.locator("[name=gpus_per_node]").fill("4")
    estimate.locator("[name=nodes]").fill("2")
    estimate.locator("[name=region]").select_option("us-west")
    estimate.locator("[name=spot_ratio]").fill("0.5")
    estimate.locator("[name=hours]").fill("2")
    launch_this = page.get_by_test_id("estimate-launch")
    expect(launch_this).to_have_attribute("href", re.compile(r"spot_ratio=0\.5"))
    expect(launch_this).to_have_attribute("href", re.compile(r"nodes=2"))
    expect(launch_this).to_have_attribute("href", re.compile(r"hours=2(&|$)"))
    expect(page.locator("#estimate-form.htmx-request")).to_have_count(0)  # no swap to come
    # The click blurs the hours field: that sends no estimate whose swap could replace
    # the link between the click's mousedown and mouseup (it did while the form's
    # trigger listened to `change`, and the click was lost).
    estimates: list[str] = []
    page.on(
        "request",
        lambda r: (
            estimates.append(r.url)
            if "/marketplace/estimate/" in r.url and "in_launch_form" not in r.url
            else None
        ),
    )
    launch_this.click()
    expect(page).to_have_url(re.compile(r"/jobs/launch/\?"))
    assert estimates == [], estimates
    expect(page.locator("#id_gpu_type")).to_have_value("h100-80gb")
    expect(gpus).to_have_value("4")
    expect(page.locator("#id_nodes")).to_have_value("2")
    expect(page.locator("#id_max_runtime_minutes")).to_have_value("120")
    expect(page.get_by_test_id("launch-split")).to_have_text("1 spot + 1 on-demand nodes")
    page.problems.assert_clean()
