"""Sign up, verify the address from the e-mail, land on the dashboard, create an API
token, see it once, revoke it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.factories import UserFactory
from tests.servers import celery_worker_process, wait_until  # noqa: F401  (fixture)

pytestmark = pytest.mark.e2e

PASSWORD = "violet-Kettle-93-orbit"
# Set to a folder to keep screenshots of the pages this test walks through.
SCREENSHOT_DIR = os.environ.get("GPUGEEK_E2E_SCREENSHOTS")


def screenshot(page, name: str) -> None:
    if SCREENSHOT_DIR:
        Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOT_DIR) / f"e2e-{name}.png"), full_page=True)


def api_me(base_url: str, token: str) -> httpx.Response:
    return httpx.get(
        f"{base_url}/api/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


def open_signup(page, base_url: str) -> None:
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    page.get_by_role("link", name=re.compile(r"Create an account")).click()
    expect(page).to_have_url(f"{base_url}/accounts/signup/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Create your account")


def fill_signup(page, *, email: str, password2: str = PASSWORD) -> None:
    page.locator("input[name=full_name]").fill("Ada Lovelace")
    page.locator("input[name=email]").fill(email)
    page.locator("input[name=organisation_name]").fill("Analytical Engines")
    page.locator("input[name=password1]").fill(PASSWORD)
    page.locator("input[name=password2]").fill(password2)


def verification_link(worker, base_url: str) -> str:
    """The link in the e-mail the real worker sent (file-based mail backend)."""
    pattern = re.compile(re.escape(base_url) + r"/accounts/verify/[\w-]+/[\w-]+/")

    def found():
        for mail_file in sorted(worker.mail_dir.glob("*")) if worker.mail_dir.exists() else []:
            match = pattern.search(mail_file.read_text())
            if match:
                return match.group(0)
        return None

    try:
        return wait_until(found, 30, what="the verification e-mail")
    except AssertionError as error:
        raise AssertionError(f"{error}\nworker log:\n{worker.log()}") from None


def activate(page, link: str) -> None:
    """Open the e-mailed link and activate the account with the sign-up's password."""
    page.goto(link)
    page.locator("input[name=password]").fill(PASSWORD)
    page.get_by_role("button", name="Activate my account").click()


def test_sign_up_create_token_see_it_once_and_revoke(
    browser_page,
    asgi_server,
    celery_worker_process,  # noqa: F811
):
    page, base = browser_page, asgi_server.url

    # 1-2. Sign up from the login page; confirm the address with the e-mailed link; land
    # on the new organisation's dashboard.
    open_signup(page, base)
    fill_signup(page, email="ada@engines.test")
    page.get_by_role("button", name="Create account").click()
    expect(page).to_have_url(f"{base}/accounts/signup/sent/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Check your e-mail")
    activate(page, verification_link(celery_worker_process, base))
    expect(page).to_have_url(f"{base}/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Analytical Engines")
    expect(page.get_by_role("heading", name="No jobs yet")).to_be_visible()
    expect(page.locator("#messages")).to_contain_text("Analytical Engines is ready")
    screenshot(page, "dashboard")

    # 3. User menu -> API tokens; create one through the htmx-enhanced form.
    menu = page.locator("details.user-menu")
    menu.locator("summary").click()
    expect(menu.locator("summary")).to_have_text("Ada Lovelace")
    expect(menu.get_by_role("link", name="API tokens")).to_be_visible()
    screenshot(page, "user-menu")
    menu.get_by_role("link", name="API tokens").click()
    expect(page).to_have_url(f"{base}/tokens/")
    expect(page.get_by_role("heading", level=1)).to_have_text("API tokens")

    page.locator("#token-area input[name=name]").fill("ci-pipeline")
    with page.expect_response(
        lambda r: r.url == f"{base}/tokens/" and r.request.method == "POST"
    ) as created:
        page.get_by_role("button", name="Create token").click()
    assert created.value.status == 200
    assert created.value.request.headers.get("hx-request") == "true", "form was not sent by htmx"
    value_input = page.locator("[data-testid=new-token-value]")
    expect(value_input).to_be_visible()
    token = value_input.input_value()
    assert token.startswith("ggt_"), token
    expect(page.locator('tr[data-token-row="ci-pipeline"]')).to_contain_text("active")
    expect(page.get_by_role("heading", level=1)).to_have_count(1)  # swapped, not nested
    screenshot(page, "tokens-created")

    me = api_me(base, token)
    assert me.status_code == 200, me.text
    assert me.json()["email"] == "ada@engines.test"

    # 4. Reloaded, the page lists the token but never shows its value again.
    page.reload()
    expect(page.locator("[data-testid=new-token-value]")).to_have_count(0)
    assert token not in page.content()
    row = page.locator('tr[data-token-row="ci-pipeline"]')
    expect(row.locator(".badge")).to_have_text("active")
    screenshot(page, "tokens")

    # 5. Revoke it after the browser's confirm dialog; htmx redirects back to the list.
    dialogs: list[str] = []

    def accept(dialog):
        dialogs.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    with page.expect_navigation(url=f"{base}/tokens/"):
        row.get_by_role("link", name="Revoke").click()
    assert dialogs and "ci-pipeline" in dialogs[0], dialogs
    expect(row.locator(".badge")).to_contain_text("revoked")
    expect(row.get_by_role("link", name="Revoke")).to_have_count(0)
    expect(page.locator("#messages")).to_contain_text("revoked; it no longer works")
    screenshot(page, "tokens-revoked")

    me = api_me(base, token)
    assert me.status_code == 401, me.text

    page.problems.assert_clean()


@pytest.mark.parametrize(
    ("case", "email", "password2", "field", "message"),
    [
        ("mismatch", "grace@engines.test", "not-the-same-93", "password2", "passwords differ"),
        # A taken address is no error (that would tell who has an account): it gets the
        # "check your e-mail" page (tests/console/test_hardening_accounts.py).
        ("mismatch-taken", "taken@engines.test", "not-the-same-93", "password2", "differ"),
    ],
    ids=["passwords-differ", "passwords-differ-taken-email"],
)
def test_sign_up_with_bad_input_shows_form_error(
    browser_page, asgi_server, case, email, password2, field, message
):
    page, base = browser_page, asgi_server.url
    UserFactory(email="taken@engines.test")

    open_signup(page, base)
    fill_signup(page, email=email, password2=password2)
    with page.expect_response(
        lambda r: r.url == f"{base}/accounts/signup/" and r.request.method == "POST"
    ) as posted:
        page.get_by_role("button", name="Create account").click()
    assert posted.value.status == 200

    expect(page).to_have_url(f"{base}/accounts/signup/")
    field_box = page.locator(f".field.has-error:has([name={field}])")
    expect(field_box.locator(".error")).to_contain_text(message)
    # The form keeps what was typed, except passwords.
    expect(page.locator("input[name=organisation_name]")).to_have_value("Analytical Engines")
    expect(page.locator("input[name=password1]")).to_have_value("")
    assert page.locator("details.user-menu").count() == 0, "signed in despite the error"
    screenshot(page, f"signup-error-{case}")

    page.problems.assert_clean()
