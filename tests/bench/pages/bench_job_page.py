"""First paint of a running job's page (issue 32 item 6; target: under 1 s on this
machine), measured in Debian's chromium by the browser's own timing: the paint entry
`first-contentful-paint` and the navigation entry (DOMContentLoaded, load).

Each load is cold (a fresh browser context: empty cache, new connection), as a person
opening a link is; the session cookie is set beforehand, so sign-in is not measured. The
console is uvicorn serving `console.asgi` as `runconsole` does (tests/servers.py), with its
compressed, hashed static files. Prints a table; asserts only that each load painted.
"""

from __future__ import annotations

import os
import statistics

import pytest

from jobs.backends.local import LocalBackend
from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync
from tests.bench.results import bench_size, record
from tests.conftest import signed_in_client
from tests.e2e.conftest import chromium_browser, watched_page  # noqa: F401
from tests.jobs_helpers import advance_to, submit
from tests.servers import asgi_server  # noqa: F401

# Playwright's sync API keeps an event loop in this thread; the browser never touches the
# ORM (as in tests/e2e/conftest.py).
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"

LOADS = 3 if bench_size() == "smoke" else 10
TARGET_MS = 1000.0

TIMING = """() => {
  const paint = performance.getEntriesByType("paint")
    .find((entry) => entry.name === "first-contentful-paint");
  const nav = performance.getEntriesByType("navigation")[0];
  return {
    fcp: paint ? paint.startTime : null,
    ttfb: nav.responseStart,
    dcl: nav.domContentLoadedEventEnd,
    load: nav.loadEventEnd,
  };
}"""


def cold_load(browser, base_url: str, session_cookie: str, path: str) -> dict:
    page = watched_page(browser, base_url)
    try:
        page.context.add_cookies([{"name": "sessionid", "value": session_cookie, "url": base_url}])
        page.goto(path, wait_until="load")
        # The paint entry can trail the load event by a frame.
        page.wait_for_function(
            "performance.getEntriesByType('paint')"
            ".some((e) => e.name === 'first-contentful-paint')",
            timeout=10_000,
        )
        timing = page.evaluate(TIMING)
        page.problems.assert_clean()
        return timing
    finally:
        page.context.close()


@pytest.mark.django_db(transaction=True)
def test_job_page_first_paint(chromium_browser, asgi_server, world):  # noqa: F811
    seed_catalog()
    capacity_sync(backend=LocalBackend())
    job = submit(world, "first-paint", region="local")
    job = advance_to(job, "running")
    client = signed_in_client(world.member, world.tenant)
    session_cookie = client.cookies["sessionid"].value
    path = f"/jobs/{job.pk}/"
    cold_load(chromium_browser, asgi_server.url, session_cookie, path)  # server warm-up
    loads = [
        cold_load(chromium_browser, asgi_server.url, session_cookie, path) for _ in range(LOADS)
    ]
    assert all(load["fcp"] for load in loads)

    print(f"\njob page, {LOADS} cold loads (ms): first contentful paint / DOMContentLoaded / load")
    figures = {
        "first contentful paint": [load["fcp"] for load in loads],
        "time to first byte": [load["ttfb"] for load in loads],
        "DOMContentLoaded": [load["dcl"] for load in loads],
        "load event": [load["load"] for load in loads],
    }
    for name, values in figures.items():
        median, worst = statistics.median(values), max(values)
        print(f"  {name:24} median {median:7.1f}  max {worst:7.1f}")
        if name == "first contentful paint":  # the figure: under 1 s, every load
            for kind, value in (("median", median), ("max", worst)):
                record(
                    "pages",
                    f"job page first contentful paint ({kind} of {LOADS} cold loads)",
                    value,
                    "ms",
                    target="< 1000 ms",
                    met=value < TARGET_MS,
                )
        else:
            record("pages", f"job page {name} (median of {LOADS} cold loads)", median, "ms")
