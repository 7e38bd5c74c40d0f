"""Browser journeys of scheduling policy (issue 31), on the real stack:

1. Staff weigh an organisation's fair share on its staff page and see it saved; a member
   of another organisation opens a queued job passed over by fair share, and its page
   says why it waits; the member reads (not changes) the organisation's self-repair
   defaults.
2. Self-repair on the sandbox: a training job runs, its owner chooses hardware repair on
   its page; staff inject an XID error on its node from the sandbox page; the job's page
   shows the hardware-fault alert and the self-repair preemption on the timeline, and
   the job runs again as attempt 2 from its checkpoint; the fleet page lists the node as
   suspect and staff mark it healthy after the confirmation.

Screenshots go to var/e2e-screens/ as in test_sandbox_journeys.py.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from playwright.sync_api import expect

from console.models import Tenant
from jobs import services
from jobs.models import Job, JobMonitor, JobStatus, WaitKind
from marketplace.demo import seed_catalog
from marketplace.models import GpuType, NodePool, Region, SuspectNode, TenantQuota
from sandbox.cluster import SandboxCluster
from tests import jobs_helpers
from tests.e2e.conftest import watched_page
from tests.e2e.test_sandbox_journeys import (
    STATUS_TIMEOUT_MS,
    expect_resumed_in_log,
    launch,
    screenshot,
    serve_sandbox,
    sign_in,
    stack,  # noqa: F401  (a fixture, over this module's `sandbox`)
    staff_user,  # noqa: F401  (a fixture)
    wait_for_status,
)
from tests.factories import DEFAULT_PASSWORD
from tests.jobs.test_self_repair import node_of
from tests.servers import (
    celery_beat_process,  # noqa: F401  (fixtures the stack needs)
    celery_worker_process,  # noqa: F401
    watcher_process,  # noqa: F401
)

pytestmark = pytest.mark.e2e

A100_ON_DEMAND = "demo-us-west-a100-80gb-on-demand"


# --- 1. staff weigh fair share; a job passed over says so ----------------------------------


def flood(world, prefix: str, count: int) -> list[Job]:
    return [
        jobs_helpers.submit(
            world, f"{prefix}-{n}", gpu_type="h100-80gb", region="local", gpus_per_node=1,
            cpus=None,
        )
        for n in range(count)
    ]  # fmt: skip


def test_staff_weigh_fair_share_and_a_passed_over_job_says_why_it_waits(
    asgi_server,
    chromium_browser,
    world,
    other_world,
    password,
    staff_user,  # noqa: F811  (the fixture imported above)
    settings,
):
    base = asgi_server.url
    journey = "31-fair-share"
    staff = watched_page(chromium_browser, base)
    try:
        sign_in(staff, base, staff_user.email, DEFAULT_PASSWORD)
        staff.goto(f"/marketplace/staff/tenants/{other_world.tenant.slug}/commercials/")
        weight = staff.get_by_label("Fair-share weight")
        expect(weight).to_have_value("1.00")
        weight.fill("3")
        staff.get_by_role("button", name="Save weight").click()
        expect(staff.locator("#messages")).to_contain_text("Fair-share weight saved")
        expect(staff.get_by_label("Fair-share weight")).to_have_value("3.00")
        screenshot(staff, journey, "1-staff-weight")
        staff.problems.assert_clean()
    finally:
        staff.context.close()
    assert Tenant.objects.get(pk=other_world.tenant.pk).fair_share_weight == Decimal("3.00")

    # Both organisations flood a closed 8-GPU pool (no worker: the queue is what counts);
    # opened for 3 GPUs, the heavier Globex is admitted ahead of Acme's later jobs.
    settings.COMPUTE_BACKENDS = ["local"]
    seed_catalog()
    TenantQuota.objects.filter(tenant__in=[world.tenant, other_world.tenant]).delete()
    pool = NodePool.objects.create(
        slug="t-h100", name="t-h100", region=Region.objects.get(slug="local"), backend="local",
        gpu_type=GpuType.objects.get(slug="h100-80gb"), node_count=1, gpus_per_node=8,
        total_gpus=8, allocatable_gpus=0, vcpus_per_node=64, allocatable_vcpus=64,
    )  # fmt: skip
    acme_jobs = flood(world, "acme", 3)
    flood(other_world, "globex", 3)
    NodePool.objects.filter(pk=pool.pk).update(allocatable_gpus=3)
    services.jobs_admit(pools=[pool.pk])
    waiting = Job.objects.filter(
        pk__in=[job.pk for job in acme_jobs], wait_kind=WaitKind.FAIR_SHARE
    ).first()
    assert waiting is not None, list(Job.objects.values_list("name", "status", "wait_kind"))

    page = watched_page(chromium_browser, base)
    try:
        sign_in(page, base, world.member.email, password)
        page.goto(f"/jobs/{waiting.pk}/")
        expect(page.get_by_test_id("job-status")).to_have_text("Queued")
        expect(page.get_by_test_id("job-status").locator("xpath=..")).to_contain_text("fair share")
        screenshot(page, journey, "2-waiting-for-its-turn")
        # What self-repair does by default is the organisation's; a member only reads it.
        page.goto("/organisation/settings/")
        defaults = page.get_by_test_id("self-repair-defaults")
        expect(defaults.get_by_label("Pause a job whose loss explodes")).to_be_checked()
        expect(defaults.get_by_label("Pause a job whose loss explodes")).to_be_disabled()
        expect(defaults).to_contain_text("Only the organisation's owners and admins")
        page.problems.assert_clean()
    finally:
        page.context.close()


# --- 2. an XID error on the sandbox: self-repair moves the job; staff clear the node -------


@pytest.fixture
def sandbox(transactional_db, settings, tmp_path, monkeypatch) -> SandboxCluster:
    """As test_sandbox_journeys' sandbox, with two on-demand A100 nodes: one to fail, one
    for the job to resume on."""
    yield from serve_sandbox(
        {A100_ON_DEMAND: 2}, settings=settings, tmp_path=tmp_path, monkeypatch=monkeypatch
    )


def test_an_xid_error_moves_the_job_and_staff_mark_the_node_healthy(
    stack,  # noqa: F811  (the fixture imported above)
    browser_page,
    chromium_browser,
    world,
    password,
    staff_user,  # noqa: F811
):
    page, base = browser_page, stack.server.url
    journey = "31-self-repair"
    job = launch(
        world.tenant,
        world.member,
        name="llama-xid",
        checkpoint_path="/ckpt/xid",
        env={"SANDBOX_DURATION_SECONDS": "300", "SANDBOX_CHECKPOINT_SECONDS": "1"},
    )
    sign_in(page, base, world.member.email, password)
    page.goto(f"/jobs/{job.pk}/")
    status = page.get_by_test_id("job-status")
    expect(status).to_have_text("Running", timeout=STATUS_TIMEOUT_MS)
    expect(page.get_by_test_id("log")).to_contain_text(
        "saved checkpoint /ckpt/xid/step-", timeout=15_000
    )
    # The job's own choice, on its page: hardware repair on whatever the organisation says.
    monitor = page.locator("[data-monitor-form]")
    repair_choice = monitor.get_by_label("When its GPU reports a hardware fault")
    expect(repair_choice).to_have_value("")  # no choice yet: the organisation's default
    repair_choice.select_option(label="Requeue it on another node")
    monitor.get_by_role("button", name="Save").click()
    expect(monitor).to_contain_text("Saved.")
    assert JobMonitor.objects.get(job=job).hardware_repair is True
    job.refresh_from_db()
    faulty = node_of(stack.cluster, job)

    staff = watched_page(chromium_browser, base)
    try:
        sign_in(staff, base, staff_user.email, DEFAULT_PASSWORD)
        staff.goto("/jobs/staff/sandbox/")
        staff.locator("tr", has_text=faulty).get_by_role("link", name="XID error…").click()
        expect(staff.get_by_role("heading", level=1)).to_contain_text(f"XID error on {faulty}")
        staff.get_by_role("button", name="Inject XID 79").click()
        expect(staff.locator("#messages")).to_contain_text(f"{faulty}'s GPUs report XID 79")
        screenshot(staff, journey, "1-staff-xid")

        # The job's page, live: the alert, the self-repair preemption, attempt 2 running.
        alerts = page.get_by_test_id("alerts")
        expect(alerts).to_contain_text("XID 79", timeout=STATUS_TIMEOUT_MS)
        timeline = page.get_by_test_id("timeline")
        expect(timeline.locator("li", has_text="preempted")).to_contain_text(
            "self-repair, hardware fault (XID error)", timeout=STATUS_TIMEOUT_MS
        )
        job = wait_for_status(job, JobStatus.RUNNING, stack)
        expect(page.locator(".stat", has_text="Attempt").locator(".stat-value")).to_have_text(
            "2", timeout=STATUS_TIMEOUT_MS
        )
        expect(status).to_have_text("Running", timeout=STATUS_TIMEOUT_MS)
        expect_resumed_in_log(page, "/ckpt/xid", job=job, stack=stack)
        assert (job.attempt, node_of(stack.cluster, job) != faulty) == (2, True)
        screenshot(page, journey, "2-resumed")

        # The fleet lists the node as suspect; staff mark it healthy after confirming.
        staff.goto("/jobs/staff/fleet/")
        suspect = staff.get_by_test_id("fleet-suspect-nodes").locator("tr", has_text=faulty)
        expect(suspect).to_contain_text("XID 79")
        screenshot(staff, journey, "3-fleet-suspect")
        suspect.get_by_role("link", name="Mark healthy…").click()
        expect(staff.get_by_role("heading", level=1)).to_contain_text(f"Mark {faulty} healthy?")
        expect(staff.locator("main")).to_contain_text("uncordoned")
        staff.get_by_role("button", name="Mark healthy").click()
        expect(staff).to_have_url(f"{base}/jobs/staff/fleet/")
        expect(staff.locator("#messages")).to_contain_text(f"{faulty} counts as healthy again")
        expect(staff.get_by_test_id("fleet-suspect-nodes")).to_contain_text("No suspect nodes")
        staff.problems.assert_clean()
    finally:
        staff.context.close()
    assert not SuspectNode.objects.exists()
    page.problems.assert_clean()
