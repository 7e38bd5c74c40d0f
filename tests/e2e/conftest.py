"""Browser tests: Playwright (sync API) driving Debian's chromium against a real uvicorn.

Playwright's sync API runs an event loop in the test thread, which makes Django refuse
ORM calls from that thread ("You cannot call this from an async context"). The browser
never touches the ORM, so allowing it here is safe; `tests.servers.child_env()` drops the
variable again for the server process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.servers import asgi_server  # noqa: F401

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"

CHROMIUM = os.environ.get("GPUGEEK_E2E_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
DEFAULT_TIMEOUT_MS = 10_000


# Per module, not per session: a running Playwright (sync API) keeps an event loop in the
# main thread, which would break async_to_sync in the tests collected after these.
@pytest.fixture(scope="module")
def chromium_browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"chromium is missing at {CHROMIUM}: browser tests need Debian's chromium "
            "(CI installs it with `apt-get install chromium`)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class BrowserProblems:
    """What went wrong in the page while a test ran: JS errors, failed requests, 5xx."""

    origin: str
    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    bad_responses: list[str] = field(default_factory=list)

    def own(self, url: str) -> bool:
        parsed = urlparse(url)
        return f"{parsed.scheme}://{parsed.netloc}" == self.origin

    def on_request_failed(self, request) -> None:
        # ERR_ABORTED is the browser cancelling a page's in-flight fetch as it navigates
        # away (a live sparkline refresh, say), not a failure of the server.
        if self.own(request.url) and request.failure != "net::ERR_ABORTED":
            self.failed_requests.append(f"{request.method} {request.url}: {request.failure}")

    def on_response(self, response) -> None:
        if not self.own(response.url):
            return
        path = urlparse(response.url).path
        if response.status >= 500 or (path.startswith("/static/") and response.status >= 400):
            self.bad_responses.append(f"{response.status} {response.request.method} {path}")

    def on_console(self, message) -> None:
        if message.type != "error":
            return
        location = (message.location or {}).get("url", "")
        # Chromium asks for /favicon.ico on its own; the console doesn't ship one (yet).
        if urlparse(location).path == "/favicon.ico":
            return
        self.console_errors.append(f"{message.text} ({location})")

    def all(self) -> list[str]:
        return [
            *(f"page error: {e}" for e in self.page_errors),
            *(f"console error: {e}" for e in self.console_errors),
            *(f"request failed: {e}" for e in self.failed_requests),
            *(f"bad response: {e}" for e in self.bad_responses),
        ]

    def assert_clean(self) -> None:
        problems = self.all()
        assert not problems, "the browser saw problems:\n" + "\n".join(problems)


def watched_page(browser, base_url: str):
    """A page in a fresh browser context (its own cookies: another person) on the test
    server; `page.problems` collects errors. The caller closes `page.context`."""
    context = browser.new_context(base_url=base_url, locale="en-GB")
    page = context.new_page()
    page.set_default_timeout(DEFAULT_TIMEOUT_MS)
    problems = BrowserProblems(origin=base_url)
    page.on("pageerror", lambda error: problems.page_errors.append(str(error)))
    page.on("console", problems.on_console)
    page.on("requestfailed", problems.on_request_failed)
    page.on("response", problems.on_response)
    page.problems = problems
    return page


@pytest.fixture
def browser_page(chromium_browser, asgi_server) -> Iterator:  # noqa: F811
    """A fresh browser context and page on the test server; `page.problems` collects errors."""
    page = watched_page(chromium_browser, asgi_server.url)
    context = page.context
    try:
        yield page
    finally:
        context.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failing browser test, add the logs of the server processes to the report."""
    report = yield
    if report.when == "call" and report.failed and "asgi_server" in item.fixturenames:
        server = item.funcargs.get("asgi_server")
        if server is not None:
            report.sections.append(("web server log", server.log()[-8000:]))
        for name, fixture in (
            ("worker", "celery_worker_process"),
            ("beat", "celery_beat_process"),
            ("watcher", "watcher_process"),
        ):
            process = item.funcargs.get(fixture)
            if process is not None:
                report.sections.append((f"{name} log", process.log()[-8000:]))
    return report
