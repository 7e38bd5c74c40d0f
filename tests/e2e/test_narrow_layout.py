"""The console on a phone (issue 32, item 14): at 390 px wide the main pages of each role
fit the screen (no sideways scrolling of the whole page; wide tables scroll in their own
box), in the dark scheme, so the axe check of conftest.py covers the dark palette too."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from jobs.backends.local import LocalBackend
from jobs.models import JobStatus
from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync
from storage.services import volume_create
from tests.billing.conftest import make_job, set_status
from tests.e2e.conftest import watched_page
from tests.e2e.test_finance_journey import last_months_invoice
from tests.e2e.test_launch_job import sign_in
from tests.factories import DEFAULT_PASSWORD, MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e

PHONE_WIDTH = 390

# The outermost elements that stick out of the viewport, outside any box that scrolls or
# clips them: what to fix when a page overflows.
OVERFLOWING = """(width) => {
    const clipped = (el) => {
        // An absolutely placed element escapes the boxes between it and its offset parent.
        const absolute = ["absolute", "fixed"].includes(getComputedStyle(el).position);
        let box = absolute ? el.offsetParent : el.parentElement;
        for (; box && box !== document.body; box = box.parentElement) {
            if (getComputedStyle(box).overflowX !== "visible") return true;
        }
        return false;
    };
    const out = [];
    for (const el of document.body.querySelectorAll("*")) {
        const right = el.getBoundingClientRect().right;
        const parent = el.parentElement.getBoundingClientRect().right;
        if (right > width + 1 && parent <= width + 1 && !clipped(el)) {
            const name = el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
                + [...el.classList].map(c => "." + c).join("");
            out.push(`${name} (right edge ${Math.round(right)} px)`);
        }
    }
    return out.slice(0, 8);
}"""


def overflow(page, path: str) -> str | None:
    """None when the page at `path` fits the phone's width, else what sticks out."""
    page.goto(path)
    expect(page.locator("main h1").first).to_be_visible()
    # Charts size themselves after load: measure after two frames.
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    width = page.evaluate("document.documentElement.scrollWidth")
    if width <= PHONE_WIDTH:
        return None
    return f"{path} is {width} px wide: {page.evaluate(OVERFLOWING, PHONE_WIDTH)}"


def phone(browser, base: str):
    return watched_page(
        browser, base, viewport={"width": PHONE_WIDTH, "height": 844}, color_scheme="dark"
    )


def test_main_pages_fit_a_phone_screen(chromium_browser, asgi_server, world, password):
    base = asgi_server.url
    seed_catalog()
    capacity_sync(backend=LocalBackend())
    started = timezone.now() - timedelta(hours=2)
    job = make_job(world, name="resnet-finetune-with-a-long-name", start=started)
    set_status(job, JobStatus.RUNNING, started)
    done = make_job(world, name="nightly-etl", start=started)
    set_status(done, JobStatus.SUCCEEDED, started + timedelta(minutes=30))
    volume_create(
        tenant=world.tenant, user=world.owner, name="datasets", size_gib=50, region="local"
    )
    last_months_invoice(world)
    staff = UserFactory(email="ops@gpugeek.test", is_staff=True)
    MembershipFactory(tenant=TenantFactory(name="GpuGeek Ops", slug="ops"), user=staff)

    pages = [
        (world.member.email, password, ["/", "/jobs/", f"/jobs/{job.pk}/", "/jobs/launch/"]),
        (
            world.owner.email,
            password,
            ["/billing/costs/", "/storage/", "/marketplace/images/", "/members/"],
        ),
        (world.finance.email, password, ["/billing/finance/", "/billing/finance/revenue/"]),
        (staff.email, DEFAULT_PASSWORD, ["/marketplace/staff/prices/"]),
    ]
    too_wide = []
    for email, secret, paths in pages:
        page = phone(chromium_browser, base)
        try:
            sign_in(page, base, email, secret)
            too_wide += [problem for path in paths if (problem := overflow(page, path))]
            if staff.email == email:  # the price book's cells say what they price
                cell = page.get_by_label("NVIDIA A100 80GB SXM in US West (Oregon)", exact=True)
                expect(cell).to_have_attribute("name", "price|a100-80gb|us-west")
            page.problems.assert_clean()
        finally:
            page.context.close()
    assert not too_wide, f"pages wider than {PHONE_WIDTH} px:\n" + "\n".join(too_wide)
