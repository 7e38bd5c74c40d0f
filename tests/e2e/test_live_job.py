"""A running local job, watched in the browser over the real stack: uvicorn, the Redis
channel layer, the watcher process, a real job process.

The page shows a line the job printed, keeps every line exactly once through a server
restart and a dropped socket (it resumes after the last line it has), and shows the
status change to succeeded without a reload. The real server also refuses foreign
sockets at the handshake (HTTP 403)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import websocket
from playwright.sync_api import expect

from console.launcher import asgi_server_argv
from jobs import services
from jobs.backends.local import LocalBackend
from jobs.models import JobStatus
from jobs.services import JobSpec
from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync
from tests.conftest import signed_in_client
from tests.servers import (
    ROOT,
    _port_open,
    child_env,
    stop_process_group,
    wait_until,
    watcher_process,  # noqa: F401
)

pytestmark = pytest.mark.e2e

# Prints numbered lines until told to stop, then a last line, and succeeds.
PROGRAM = """
import os, sys, time
stop = sys.argv[1]
n = 0
while not os.path.exists(stop):
    n += 1
    print(f"line {n}", flush=True)
    time.sleep(0.02)
print("final line", flush=True)
"""


def sign_in(page, base_url: str, email: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.locator("input[name=username]").fill(email)
    page.locator("input[name=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{base_url}/")


def restart_server(server) -> None:
    """Stop the ASGI server and start it again on the same port (a deploy, a crash)."""
    stop_process_group(server.process)
    with server.log_path.open("ab") as log_file:
        server.process = subprocess.Popen(
            asgi_server_argv("127.0.0.1", server.port),
            cwd=ROOT,
            env=child_env(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_until(lambda: _port_open(server.port), 30, what="the ASGI server restarted")


def shown_lines(page) -> list[tuple[int, str]]:
    return page.eval_on_selector_all(
        "[data-log-lines] .log-line",
        "rows => rows.map(r => [Number(r.dataset.line), r.textContent])",
    )


def highest_line(page) -> int:
    rows = shown_lines(page)
    return rows[-1][0] if rows else 0


def refusal_status(url: str, **options) -> int:
    try:
        sock = websocket.create_connection(url, timeout=5, **options)
    except websocket.WebSocketBadStatusException as refused:
        return refused.status_code
    sock.close()
    raise AssertionError(f"{url} was accepted")


def test_live_logs_and_status_survive_reconnects(
    browser_page,
    asgi_server,
    watcher_process,  # noqa: F811
    world,
    other_world,
    password,
    request,
):
    page, base = browser_page, asgi_server.url
    # The fixture stops the server it started; this test may replace it (restart_server).
    request.addfinalizer(lambda: stop_process_group(asgi_server.process))
    seed_catalog()
    capacity_sync(backend=LocalBackend())
    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=JobSpec(
            name="live lines",
            image="python-3.11",
            # In its work dir (its cwd): the sandbox shows the job no other host path.
            command=["python", "-c", PROGRAM, "stop"],
            cpus=1,
        ),
    )
    stop_file = LocalBackend().workdir(job) / "stop"
    job = services.job_dispatch(job=job)  # what the Celery task does

    sign_in(page, base, world.member.email, password)
    page.goto(f"/jobs/{job.pk}/")
    log = page.get_by_test_id("log")
    expect(log).to_contain_text("line 3")
    expect(page.get_by_test_id("live-state")).to_have_attribute("data-state", "open")
    expect(page.get_by_test_id("job-status")).to_have_text("Running", timeout=15_000)

    # A server restart: the page reconnects by itself and resumes after its last line.
    before = highest_line(page)
    restart_server(asgi_server)
    expect(page.get_by_test_id("live-state")).to_have_attribute(
        "data-state", "open", timeout=20_000
    )
    wait_until(lambda: highest_line(page) > before + 20, 20, what="lines after the restart")
    # What the browser reported while the server was down (refused connections, a failed
    # poll) is the outage itself, not a fault of the page.
    page.problems.console_errors.clear()
    page.problems.failed_requests.clear()

    # A dropped socket (network blip), then the job ends.
    page.evaluate("window.ggJobLive.reconnect()")
    expect(page.get_by_test_id("live-state")).to_have_attribute(
        "data-state", "open", timeout=20_000
    )
    # The job list in another tab, live over the tenant socket.
    listing = page.context.new_page()
    listing.goto("/jobs/")
    row = listing.locator(f"tr[data-job='{job.pk}']")
    expect(row).to_contain_text("Running")
    expect(listing.locator("html")).to_have_attribute("data-tenant-socket", "open")
    # And the dashboard's job list, live the same way.
    dashboard = page.context.new_page()
    dashboard.goto("/")
    dashboard_row = dashboard.locator(f"#dashboard-jobs tr[data-job='{job.pk}']")
    expect(dashboard_row).to_contain_text("Running")
    expect(dashboard.get_by_test_id("running-count")).to_have_text("1")
    expect(dashboard.locator("html")).to_have_attribute("data-tenant-socket", "open")
    time.sleep(0.5)
    stop_file.write_text("")
    expect(log).to_contain_text("final line", timeout=15_000)
    expect(page.get_by_test_id("job-status")).to_have_text("Succeeded", timeout=15_000)
    expect(page.get_by_test_id("timeline")).to_contain_text("succeeded")
    # Faster than the list's 5 s fallback poll: the status message refreshed it.
    expect(row).to_contain_text("Succeeded", timeout=4_000)
    expect(dashboard_row).to_contain_text("Succeeded", timeout=4_000)
    expect(dashboard.get_by_test_id("running-count")).to_have_text("0")

    if os.environ.get("GPUGEEK_E2E_SCREENSHOTS"):  # a folder to keep a picture of the page
        folder = Path(os.environ["GPUGEEK_E2E_SCREENSHOTS"])
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / "e2e-live-job.png"), full_page=True)
    rows = shown_lines(page)
    numbers = [number for number, _ in rows]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), "gap or duplicate"
    assert rows[-1][1] == "final line"
    assert all(text == f"line {number}" for number, text in rows[:-1])
    assert len(rows) == LocalBackend().logs(job, limit=100000)[-1].line_no - numbers[0] + 1
    # Finished: nothing is live any more, and a filter counts the lines it shows.
    expect(page.get_by_test_id("live-state")).to_have_attribute("data-state", "ended")
    expect(page.get_by_test_id("live-state")).to_have_text("finished")
    page.locator("[data-log-filter]").fill("final line")
    expect(page.locator("[data-log-info]")).to_contain_text(
        f"1 of {len(rows)} loaded lines match the filter"
    )
    page.reload()  # a finished job's page says so from the start
    expect(page.get_by_test_id("live-state")).to_have_attribute("data-state", "ended")
    page.problems.assert_clean()

    # Handshake refusals on the real server: foreign Origin, anonymous, other tenant.
    url = f"{asgi_server.ws_url}/ws/jobs/{job.pk}/"
    member_cookie = f"sessionid={signed_in_client(world.member).cookies['sessionid'].value}"
    assert refusal_status(url, origin="http://evil.example", cookie=member_cookie) == 403
    assert refusal_status(url, origin=base) == 403
    outsider = signed_in_client(other_world.member, other_world.tenant)
    outsider_cookie = f"sessionid={outsider.cookies['sessionid'].value}"
    assert refusal_status(url, origin=base, cookie=outsider_cookie) == 403
    sock = websocket.create_connection(url, timeout=5, origin=base, cookie=member_cookie)
    try:
        import json

        first = json.loads(sock.recv())
        assert (first["type"], first["status"]) == ("status", JobStatus.SUCCEEDED)
    finally:
        sock.close()
