"""Feedback while a request is in flight (static/js/busy.js): a submitted form's button is
disabled with a busy label, and every htmx request shows the page's busy bar and marks the
region it will replace. Requests are held by the browser (page.route) so the in-flight
state can be looked at, then let go."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e


class HeldRequests:
    """Requests matching a pattern wait in the browser until `release()`."""

    def __init__(self, page, pattern, method: str):
        self.routes: list = []
        self.method = method
        page.route(pattern, self._hold)

    def _hold(self, route) -> None:
        if route.request.method == self.method:
            self.routes.append(route)
        else:
            route.continue_()

    def release(self) -> None:
        while self.routes:
            self.routes.pop().continue_()


def test_sign_in_button_is_busy_until_the_answer(browser_page, asgi_server, world, password):
    page = browser_page
    page.goto("/accounts/login/")
    # The page is gone once the answer comes: it notes its button's states as they change,
    # where the next page of this origin can read them.
    page.evaluate(
        """() => {
          const button = document.querySelector("main form button[type=submit]");
          new MutationObserver(() => {
            const seen = JSON.parse(sessionStorage.getItem("button-states") || "[]");
            seen.push([button.disabled, button.textContent]);
            sessionStorage.setItem("button-states", JSON.stringify(seen));
          }).observe(button, {attributes: true, childList: true, characterData: true});
        }"""
    )
    page.locator("input[name=username]").fill(world.member.email)
    page.locator("input[name=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{asgi_server.url}/")
    states = page.evaluate("JSON.parse(sessionStorage.getItem('button-states') || '[]')")
    assert [True, "Signing in…"] in states
    page.problems.assert_clean()


def test_htmx_request_shows_the_busy_bar_and_marks_its_target(
    browser_page, asgi_server, world, password
):
    page = browser_page
    page.goto("/accounts/login/")
    page.locator("input[name=username]").fill(world.member.email)
    page.locator("input[name=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{asgi_server.url}/")

    page.goto("/billing/costs/")
    bar = page.locator("#busy-indicator")
    expect(bar).not_to_have_class(re.compile("htmx-request"))
    held = HeldRequests(page, re.compile(r"/billing/costs/\?"), "GET")
    page.get_by_label("Group by").select_option("job")
    expect(bar).to_have_class(re.compile("htmx-request"))
    expect(bar).to_have_css("opacity", "1")  # after its 300 ms delay
    expect(page.locator("#explorer")).to_have_attribute("aria-busy", "true")
    held.release()
    expect(bar).not_to_have_class(re.compile("htmx-request"))
    expect(page.locator("#explorer")).not_to_have_attribute("aria-busy", "true")
    assert "group_by=job" in page.url
    page.problems.assert_clean()
