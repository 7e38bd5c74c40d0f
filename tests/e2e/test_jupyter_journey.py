"""A dev environment with Jupyter, from the browser, with every real process: the member
creates it on the Environments page, starts it (a Celery worker dispatches its job to
the local backend, the watcher sees it run), presses Open Jupyter, and runs a cell in a
notebook of Debian's Jupyter (nbclassic) through the console's gateway, without ever
typing a token."""

from __future__ import annotations

import os
import shutil

import pytest
from playwright.sync_api import expect

from environments.models import Environment
from jobs.backends.local import LocalBackend
from jobs.backends.local_sandbox import sandbox_support
from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync
from tests.e2e.test_launch_job import sign_in
from tests.servers import celery_worker_process, watcher_process  # noqa: F401

pytestmark = pytest.mark.e2e
STARTED_TIMEOUT_MS = 60_000

if not os.environ.get("CI") and (
    not sandbox_support().network or not shutil.which("jupyter-nbclassic")
):
    pytest.skip("no host sandbox with network, or no Debian Jupyter, here",
                allow_module_level=True)  # fmt: skip


def test_create_start_open_jupyter_and_run_a_cell(
    browser_page,
    asgi_server,
    celery_worker_process,  # noqa: F811
    watcher_process,  # noqa: F811
    world,
    password,
):
    page, base = browser_page, asgi_server.url
    seed_catalog()
    capacity_sync(backend=LocalBackend())

    sign_in(page, base, world.member.email, password)
    page.goto("/environments/")
    page.get_by_label("Name").fill("lab")
    page.get_by_label("Region").select_option("local")
    page.get_by_label("Image").select_option("python-3.11")
    page.get_by_label("Connect with").select_option("jupyter")
    page.get_by_label("CPUs").fill("1")
    page.get_by_role("button", name="Create").click()
    expect(page).to_have_url(f"{base}/environments/lab/")
    expect(page.get_by_text("Connect with SSH")).to_have_count(0)  # Jupyter only

    page.get_by_role("button", name="Start").click()
    open_jupyter = page.get_by_test_id("open-jupyter")
    try:
        expect(open_jupyter).to_be_visible(timeout=STARTED_TIMEOUT_MS)
    except AssertionError as error:
        environment = Environment.objects.get(name="lab")
        raise AssertionError(
            f"{error}\nenvironment: {environment.status} ({environment.status_reason})\n"
            f"worker log:\n{celery_worker_process.log()[-4000:]}\n"
            f"watcher log:\n{watcher_process.log()[-4000:]}"
        ) from None
    page.problems.assert_clean()

    with page.context.expect_page() as opened:
        open_jupyter.click()
    tree = opened.value
    # Jupyter may still be starting: the gateway's page says so and tries again by itself.
    expect(tree.locator("#notebook_list")).to_be_visible(timeout=STARTED_TIMEOUT_MS)
    assert tree.url.startswith(f"{base}/env/acme/lab/")

    with tree.context.expect_page() as notebook_opened:
        tree.locator("#new-dropdown-button").click()
        tree.locator("#kernel-python3 a").click()
    notebook = notebook_opened.value
    expect(notebook.locator("#kernel_indicator_icon.kernel_idle_icon")).to_be_attached(
        timeout=STARTED_TIMEOUT_MS
    )
    notebook.locator(".CodeMirror").first.click()
    notebook.keyboard.type("import os; print(os.getcwd(), 6 * 7)")
    notebook.keyboard.press("Shift+Enter")
    expect(notebook.locator(".output_area pre").first).to_have_text(
        "/workspace 42", timeout=STARTED_TIMEOUT_MS
    )
