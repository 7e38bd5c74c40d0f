"""The GPU recommender on the launch form, in a browser: enter a model size, get the
options table, and "Use" one: the form's GPU type, GPUs per node, nodes and region take
its values and the live estimate follows."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import catalog_seed
from tests.e2e.test_launch_choices import cluster_pools_launchable  # noqa: F401
from tests.e2e.test_launch_job import sign_in

pytestmark = pytest.mark.e2e


def test_recommend_gpus_fills_the_launch_form(
    cluster_pools_launchable,  # noqa: F811 (the form offers the demo's H100 pools)
    browser_page,
    asgi_server,
    world,
    password,
):
    page, base = browser_page, asgi_server.url
    catalog_seed()

    sign_in(page, base, world.member.email, password)
    page.goto("/jobs/launch/")
    page.get_by_text("Recommend GPUs").first.click()  # opens the panel
    page.get_by_label("Model size (billion parameters)").fill("7")
    page.get_by_label("Workload").select_option("full_finetune")
    page.get_by_label("Precision").select_option("bf16")
    page.get_by_label("Sequence length (tokens)").fill("4096")
    page.get_by_label("Batch size").fill("8")
    page.get_by_role("button", name="Recommend GPUs").click()

    expect(page.get_by_test_id("recommend-memory")).to_contain_text("GPU memory needed:")
    table = page.get_by_test_id("recommend-table")
    h100 = table.locator("button[data-gpu-type='h100-80gb'][data-region='us-west']")
    h100.click()

    expect(page.locator("#id_gpu_type")).to_have_value("h100-80gb")
    expect(page.locator("#id_gpus_per_node")).to_have_value("2")
    expect(page.locator("#id_nodes")).to_have_value("1")
    expect(page.locator("#id_region")).to_have_value("us-west")
    expect(page.locator("#id_spot_ratio")).to_have_value("0")
    expect(h100).to_have_text("Filled in")
    # The live estimate follows the filled form: 2 × 2.99 an hour, for the default hour.
    expect(page.get_by_test_id("estimate-hourly")).to_have_text("5.98 USD")
    page.problems.assert_clean()
