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

from tests.servers import ROOT, asgi_server  # noqa: F401

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"

CHROMIUM = os.environ.get("GPUGEEK_E2E_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
DEFAULT_TIMEOUT_MS = 10_000

# axe-core from npm (package.json's devDependencies, `make setup` runs `npm ci`). Tests
# read it from node_modules/: it is never served to users, so it has no static/ copy.
AXE_SCRIPT = ROOT / "node_modules" / "axe-core" / "axe.min.js"
AXE_FAILING_IMPACTS = ("serious", "critical")
# Violations another change owns, by (path, rule), with who fixes them: remove each entry
# with its fix.
# (page path, rule) pairs not failed here, each with why: none at present.
AXE_FIXED_ELSEWHERE: dict[tuple[str, str], str] = {}
# Runs in the page (axe is there from an init script); null for a non-HTML document.
# axe refuses a second run while one is under way, so runs queue up on one promise.
# axe 4.x no longer checks that ids are unique (WCAG 2.2 dropped 4.1.1), but a duplicate
# id still points a label or aria reference at the wrong element: checked here too.
AXE_RUN = """async (impacts) => {
    if (document.contentType !== "text/html" || typeof axe === "undefined") return null;
    // The settled page is checked: content dimmed while an htmx request is under way
    // (app.css [aria-busy]) is stale on purpose, not the page's contrast (2 s at most).
    const settled = async () => {
        for (let i = 0; i < 40 && document.querySelector('[aria-busy="true"], .htmx-request'); i++)
            await new Promise(resolve => setTimeout(resolve, 50));
    };
    const run = () => settled().then(() => axe.run(document, {resultTypes: ["violations"]}));
    window.ggAxeRun = (window.ggAxeRun || Promise.resolve()).catch(() => null).then(run);
    const results = await window.ggAxeRun;
    const found = results.violations.filter(v => impacts.includes(v.impact)).map(v => ({
        rule: v.id, impact: v.impact, help: v.help,
        targets: v.nodes.slice(0, 5).map(n => n.target.join(" ")),
        why: (v.nodes[0] && v.nodes[0].failureSummary || "").slice(0, 300),
        count: v.nodes.length,
    }));
    const seen = new Map();
    for (const el of document.querySelectorAll("[id]")) seen.set(el.id, (seen.get(el.id) || 0) + 1);
    const twice = [...seen].filter(([, n]) => n > 1).map(([id]) => "#" + id);
    if (twice.length) found.push({
        rule: "unique-id", impact: "serious", help: "ids must be unique in the page",
        targets: twice.slice(0, 5), count: twice.length,
    });
    return found;
}"""


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


class AxeAudit:
    """axe-core on every console page a browser context loads: serious or critical
    violations fail the test (see `pytest_runtest_call`).

    Each page is checked as its `load` event arrives. Playwright runs that handler beside
    the test (it does not hold the test back), so a test that navigates on at once can cut
    a check short; such pages are loaded again (GET, same cookies) when the context
    closes or the test ends, and every page still open is checked in its final state
    (what htmx swapped in included)."""

    def __init__(self, context, origin: str):
        self.context = context
        self.origin = origin
        self.checked: set[str] = set()
        self.unchecked: list[str] = []
        self.violations: dict[tuple[str, str], dict] = {}
        self.in_flight = 0
        self.finished = False
        self.watched: set[int] = set()
        context.add_init_script(path=str(AXE_SCRIPT))
        context.on("page", self.watch)
        close = context.close

        def close_after_audit(*args, **kwargs):
            try:
                self.finish()
            finally:
                close(*args, **kwargs)

        context.close = close_after_audit  # pages a test closes itself are audited too

    def watch(self, page) -> None:
        if id(page) not in self.watched:
            self.watched.add(id(page))
            page.on("load", self.on_load)

    def console_path(self, url: str) -> str | None:
        parsed = urlparse(url)
        if f"{parsed.scheme}://{parsed.netloc}" != self.origin:
            return None
        if parsed.path.startswith("/env/"):  # a user's Jupyter, not a page of the console
            return None
        return parsed.path

    def on_load(self, page) -> None:
        url = page.url
        if self.console_path(url) is None or self.finished:
            return
        self.in_flight += 1
        try:
            self.check(page, url)
        except Exception:  # the test navigated on (or closed the page) mid-check
            self.unchecked.append(url)
        finally:
            self.in_flight -= 1

    def check(self, page, url: str) -> None:
        found = page.evaluate(AXE_RUN, list(AXE_FAILING_IMPACTS))
        path = self.console_path(url)
        if found is None or path is None:
            return
        self.checked.add(url)
        for violation in found:
            if (path, violation["rule"]) not in AXE_FIXED_ELSEWHERE:
                self.violations.setdefault((path, violation["rule"]), violation)

    def finish(self) -> None:
        """Wait (bounded) for checks under way, then check what they missed."""
        if self.finished:
            return
        pages = [page for page in self.context.pages if not page.is_closed()]
        for _ in range(200):  # 20 s at most; the wait lets the load handlers run
            if not self.in_flight or not pages:
                break
            pages[0].wait_for_timeout(100)
        self.finished = True
        for page in pages:
            if self.console_path(page.url) is not None:
                try:
                    self.check(page, page.url)
                except Exception:  # still navigating: loaded again below
                    self.unchecked.append(page.url)
        missed = dict.fromkeys(url for url in self.unchecked if url not in self.checked)
        if not missed:
            return
        page = self.context.new_page()
        try:
            for url in missed:
                page.goto(url)
                self.check(page, page.url)
        finally:
            page.close()

    def report(self) -> list[str]:
        return [
            f"{path}: {rule} ({v['impact']}, {v['count']} elements) {v['help']}: "
            + ", ".join(v["targets"])
            + (f" — {v['why']}" if v.get("why") else "")
            for (path, rule), v in sorted(self.violations.items())
        ]


# The audits of the running test's contexts, reported after its call (pytest_runtest_call).
_audits: list[AxeAudit] = []


def watched_page(browser, base_url: str, **context_options):
    """A page in a fresh browser context (its own cookies: another person) on the test
    server; `page.problems` collects errors and axe checks every page it loads. The
    caller closes `page.context`; `context_options` go to `browser.new_context`."""
    if not AXE_SCRIPT.exists():
        pytest.fail(f"axe-core is missing at {AXE_SCRIPT}: run `make setup` (npm ci)")
    context = browser.new_context(base_url=base_url, locale="en-GB", **context_options)
    audit = AxeAudit(context, base_url)
    _audits.append(audit)
    page = context.new_page()
    audit.watch(page)  # before its first navigation, whenever the "page" event comes
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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _audits.clear()  # a test whose setup failed left its audits behind


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A browser test that passed fails on any serious or critical axe violation on the
    pages it visited (a failing test keeps its own error)."""
    try:
        result = yield
    except BaseException:
        for audit in _audits:
            audit.finished = True  # nothing to add to the test's own failure
        _audits.clear()
        raise
    audits, problems = list(_audits), []
    _audits.clear()
    for audit in audits:
        audit.finish()
        problems.extend(audit.report())
    if problems:
        pytest.fail(
            "axe-core found serious or critical accessibility violations:\n"
            + "\n".join(dict.fromkeys(problems)),
            pytrace=False,
        )
    return result


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
