"""Launch a job from the browser and watch it run to the end, with every real process:
uvicorn serves the pages, a Celery worker dispatches the job to the local backend, and
the watcher (`manage.py run_watcher`) reports what the job's process does."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from jobs.backends.local import LocalBackend
from jobs.models import Job, JobStatus
from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync
from tests.servers import celery_worker_process, watcher_process  # noqa: F401

pytestmark = pytest.mark.e2e

# Sleeps longer than the detail page's 2 s poll, so the page is sure to show it running.
COMMAND = "python -c \"import time; print('hi', flush=True); time.sleep(3)\""
STATUS_TIMEOUT_MS = 20_000


def sign_in(page, base_url: str, email: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.locator("input[name=username]").fill(email)
    page.locator("input[name=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{base_url}/")


def test_launch_a_job_and_watch_it_run_to_success(
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
    page.goto("/jobs/launch/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Launch a job")
    expect(page.locator("select[name=image]")).to_have_value("python-3.11")
    page.locator("input[name=name]").fill("hello from the browser")
    page.locator("input[name=command]").fill(COMMAND)
    page.get_by_role("button", name="Launch").click()

    expect(page).to_have_url(re.compile(rf"^{re.escape(base)}/jobs/\d+/$"))
    job = Job.objects.get(name="hello from the browser")
    assert page.url == f"{base}/jobs/{job.pk}/"
    assert job.command == ["python", "-c", "import time; print('hi', flush=True); time.sleep(3)"]
    expect(page.get_by_role("heading", level=1)).to_contain_text("hello from the browser")

    status = page.get_by_test_id("job-status")
    try:
        expect(status).to_have_text("Running", timeout=STATUS_TIMEOUT_MS)
        expect(status).to_have_text("Succeeded", timeout=STATUS_TIMEOUT_MS)
    except AssertionError as error:
        job.refresh_from_db()
        raise AssertionError(
            f"{error}\njob: {job.status} ({job.status_reason})\n"
            f"worker log:\n{celery_worker_process.log()[-4000:]}\n"
            f"watcher log:\n{watcher_process.log()[-4000:]}"
        ) from None
    expect(page.get_by_test_id("log")).to_have_text("hi")
    timeline = page.get_by_test_id("timeline")
    for step in ("dispatching", "running", "succeeded"):
        expect(timeline).to_contain_text(step)
    # Finished: the page stops polling and offers to delete the job instead of cancelling.
    expect(page.locator("#job-status[hx-get]")).to_have_count(0)
    expect(page.get_by_role("link", name="Delete")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)

    job.refresh_from_db()
    assert (job.status, job.exit_code) == (JobStatus.SUCCEEDED, 0)
    assert [e.to_status for e in job.events.all()] == [
        "queued",
        "dispatching",
        "running",
        "succeeded",
    ]
    page.problems.assert_clean()
