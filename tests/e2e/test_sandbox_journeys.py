"""The four browser journeys of the sandbox cluster (issue 15), on the real stack: uvicorn,
a Celery worker, Celery beat, the watcher, and the sandbox cluster (the simulated
Kubernetes API server with its simulated training workloads) that the real Kubernetes
backend talks to through the official client.

1. A new user signs up, browses the offers (simulated badge), estimates 8×A100-80GB at
   spot ratio 0.7, launches it on the sandbox, watches logs and GPU charts move live,
   pauses, resumes, and sees it succeed and what it cost.
2. A tenant admin sets a small budget; one metering tick later the running non-critical
   job is paused; the banner and the timeline name the budget; raising the budget
   resumes it.
3. Staff reclaim spot capacity; the user's spot job is preempted and runs again as a new
   attempt whose log continues, and the timeline says why.
4. Staff publish a price change effective next hour; the offers page shows both prices.

Screenshots of each key screen go to var/e2e-screens/<journey>-<step>.png (ignored by
git; CI leaves them in its clone's var/e2e-screens/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from billing import tasks as billing_tasks
from console.env import stored_sandbox_token
from console.models import Tenant
from console.queueing import enqueue_now
from jobs import services
from jobs.actors import ActorKind
from jobs.backends import get_backend
from jobs.backends.kubernetes.sandbox import sandbox_nodes, write_sandbox_files
from jobs.logs.leases import followed
from jobs.logs.reading import read_lines
from jobs.models import Job, JobStatus
from jobs.services import JobSpec
from marketplace.demo import seed_catalog
from marketplace.models import GpuType, NodePool, Region
from marketplace.pricing import estimate_cost
from marketplace.services import capacity_sync
from sandbox.cluster import SandboxCluster
from tests.e2e.conftest import watched_page
from tests.e2e.test_signup_tokens import activate, fill_signup, open_signup, verification_link
from tests.factories import DEFAULT_PASSWORD, MembershipFactory, TenantFactory, UserFactory
from tests.servers import (
    ROOT,
    celery_beat_process,  # noqa: F401
    celery_worker_process,  # noqa: F401
    wait_until,
    watcher_process,  # noqa: F401
)

pytestmark = pytest.mark.e2e

SCREENS = ROOT / "var" / "e2e-screens"
A100_ON_DEMAND = "demo-us-west-a100-80gb-on-demand"
A100_SPOT = "demo-us-west-a100-80gb-spot"
IMAGE = "pytorch-2-5-cuda12-4"
STATUS_TIMEOUT_MS = 30_000

# Records what the page's sockets deliver (status changes and alerts, not log lines), so
# a test can tell that a change reached the page live, without a reload.
SOCKET_RECORDER = """
(() => {
  const Native = window.WebSocket;
  window.ggReceived = [];
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (event) => {
        const message = JSON.parse(event.data);
        if (message.type === "status" || message.type === "alert") window.ggReceived.push(message);
      });
    }
  };
})();
"""


def screenshot(page, journey: str, step: str) -> None:
    SCREENS.mkdir(parents=True, exist_ok=True)
    # From the top: scrolled, the sticky header would be drawn in the middle of the page.
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SCREENS / f"{journey}-{step}.png"), full_page=True)


def sign_in(page, base_url: str, email: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.locator("input[name=username]").fill(email)
    page.locator("input[name=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{base_url}/")


@dataclass
class Stack:
    cluster: SandboxCluster
    server: object
    worker: object
    beat: object
    watcher: object

    def logs(self) -> str:
        return "\n".join(
            f"--- {name} log ---\n{process.log()[-6000:]}"
            for name, process in (
                ("worker", self.worker),
                ("watcher", self.watcher),
                ("web", self.server),
            )
        )


@pytest.fixture
def sandbox(transactional_db, settings, tmp_path, monkeypatch) -> SandboxCluster:
    """The sandbox cluster, in this process's threads: one node of the demo's us-west
    A100-80GB on-demand and spot pools. The console's processes started after it reach it
    through the environment runconsole would give them (SANDBOX_URL, KUBECONFIG; the token
    is the data dir's `sandbox/token`, shared with them)."""
    yield from serve_sandbox(
        {A100_ON_DEMAND: 1, A100_SPOT: 1},
        settings=settings,
        tmp_path=tmp_path,
        monkeypatch=monkeypatch,
    )


def serve_sandbox(node_counts: dict[str, int], *, settings, tmp_path, monkeypatch):
    """Start the sandbox with `node_counts` nodes of those demo pools (by slug), point
    this process and the console processes started after it at it, yield it, stop it."""
    seed_catalog()
    pools = list(
        NodePool.objects.filter(slug__in=list(node_counts))
        .select_related("region", "gpu_type")
        .order_by("slug")
    )
    for pool in pools:
        pool.node_count = node_counts[pool.slug]
    token = stored_sandbox_token(settings.DATA_DIR)
    cluster = SandboxCluster(
        sandbox_nodes(pools), token=token, tick_seconds=0.25, pod_start_delay=0.5
    ).start()
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text("[]")  # present: write_sandbox_files keeps it
    kubeconfig = tmp_path / "kubeconfig"
    write_sandbox_files(
        nodes_file=nodes_file, kubeconfig_file=kubeconfig, url=cluster.server.url, token=token
    )
    environment = {
        "SANDBOX_URL": cluster.server.url,
        "KUBECONFIG": str(kubeconfig),
        "COMPUTE_BACKENDS": "local,kubernetes",
        # Beat collects GPU readings every 2 s; metering ticks are the tests' to trigger.
        "METRICS_INTERVAL": "2",
        "METERING_INTERVAL": "3600",
        "KUBERNETES_REQUEST_TIMEOUT": "5",
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings.SANDBOX_URL = cluster.server.url
    settings.SANDBOX_TOKEN = token
    settings.KUBECONFIG = str(kubeconfig)
    settings.PROMETHEUS_URL = f"{cluster.server.url}/prometheus"
    settings.COMPUTE_BACKENDS = ["local", "kubernetes"]
    capacity_sync(backend=get_backend("kubernetes"))
    yield cluster
    cluster.stop()
    assert cluster.server.errors == []


@pytest.fixture
def stack(
    sandbox,
    asgi_server,
    celery_worker_process,  # noqa: F811
    celery_beat_process,  # noqa: F811
    watcher_process,  # noqa: F811
) -> Stack:
    """Every process of the console, started after (and so pointed at) the sandbox."""
    return Stack(sandbox, asgi_server, celery_worker_process, celery_beat_process, watcher_process)


@pytest.fixture
def staff_user(db):
    staff = UserFactory(email="ops@gpugeek.test", is_staff=True, full_name="Olive Ops")
    MembershipFactory(tenant=TenantFactory(name="GpuGeek Ops", slug="ops"), user=staff)
    return staff


def launch(tenant, user, **overrides) -> Job:
    """Submit a job as the API would; the worker dispatches it to the sandbox."""
    values = {
        "name": "nightly-eval",
        "image": IMAGE,
        "command": ["torchrun", "--nproc-per-node", "8", "train.py"],
        "gpu_type": "a100-80gb",
        "gpus_per_node": 8,
        "cpus": 16,
        "region": "us-west",
        "checkpoint_path": "/ckpt/eval",
        "env": {"SANDBOX_DURATION_SECONDS": "300", "SANDBOX_CHECKPOINT_SECONDS": "5"},
    }
    values.update(overrides)
    job = services.job_submit(tenant=tenant, user=user, spec=JobSpec(**values))
    assert job.status == JobStatus.DISPATCHING, job.status_reason
    return job


def wait_for_status(job: Job, status: str, stack: Stack, timeout: float = 30) -> Job:
    try:
        wait_until(
            lambda: Job.objects.filter(pk=job.pk, status=status).exists(),
            timeout,
            what=f"job {job.pk} {status}",
        )
    except AssertionError as error:
        job.refresh_from_db()
        raise AssertionError(
            f"{error}; it is {job.status} ({job.status_reason})\n{stack.logs()}"
        ) from None
    job.refresh_from_db()
    return job


def expect_in_log(page, pattern, *, job: Job, stack: Stack, timeout: int) -> None:
    """`pattern` shows in the page's log within `timeout` ms; a failure says what the
    store, the pods and the console's processes had, not only what the page showed."""
    try:
        expect(page.get_by_test_id("log")).to_contain_text(pattern, timeout=timeout)
    except AssertionError as error:
        job.refresh_from_db()
        is_followed = followed(job.pk)  # before read_lines, which may sync the spool itself
        stored = [line["text"] for line in read_lines(job, limit=1000)["lines"]]
        sources = get_backend(job.backend).log_sources(job)
        socket = page.evaluate("document.documentElement.dataset.jobSocket || 'none'")
        viewer = page.evaluate(
            """() => { const l = window.ggJobLive && window.ggJobLive.logs; return l ? {
                first: l.first, last: l.last, latest: l.latest, following: l.following,
                paused: l.paused, busy: l.busy } : null; }"""
        )
        raise AssertionError(
            f"{error}\n{job.status} attempt {job.attempt}; socket {socket}; viewer {viewer}; "
            f"followed {is_followed}; log info: {page.locator('[data-log-info]').inner_text()}"
            f"\nstored: {stored[-8:]}\n"
            f"sources: {sources}\nbrowser: {page.problems.all()}\n{stack.logs()}"
        ) from None


def expect_resumed_in_log(page, checkpoint: str, *, job: Job, stack: Stack) -> None:
    """The resumed attempt says, in the page's log, that it goes on from a checkpointed step."""
    pattern = rf"GPUGEEK_RESUMED=1: resuming from {re.escape(checkpoint)} at step [1-9]\d*"
    expect_in_log(page, re.compile(pattern), job=job, stack=stack, timeout=15_000)


def shown_lines(page) -> list[tuple[int, str]]:
    return page.eval_on_selector_all(
        "[data-log-lines] .log-line",
        "rows => rows.map(r => [Number(r.dataset.line), r.textContent])",
    )


def highest_line(page) -> int:
    rows = shown_lines(page)
    return rows[-1][0] if rows else 0


def chart_points(page) -> int:
    """Points drawn on the GPU utilisation chart (all traces)."""
    return page.evaluate(
        """() => {
          const div = document.querySelector("[data-chart=utilization]");
          return div && div.data ? div.data.reduce((n, t) => n + (t.x ? t.x.length : 0), 0) : 0;
        }"""
    )


def received_statuses(page) -> list[tuple[str, int]]:
    return [
        (m["status"], m["attempt"])
        for m in page.evaluate("window.ggReceived")
        if m["type"] == "status"
    ]


def assert_no_alerts(page, job: Job) -> None:
    shown = page.get_by_test_id("alerts").locator("li").all_inner_texts()
    raised = list(job.events.filter(actor_kind=ActorKind.ALERT).values_list("reason", flat=True))
    assert not shown and not raised, (shown, raised)
    expect(page.get_by_test_id("alerts")).to_be_hidden()


def money(text: str) -> Decimal:
    return Decimal(re.search(r"\d+\.\d+", text).group(0))


# --- 1. sign up, estimate, launch on the sandbox, watch, pause, resume, succeed -----------


def test_new_user_launches_an_a100_spot_cluster_and_watches_it_to_the_end(stack, browser_page):
    page, base = browser_page, stack.server.url
    journey = "1-new-user"

    # Sign up and confirm the address from the e-mail.
    open_signup(page, base)
    fill_signup(page, email="ada@engines.test")
    page.get_by_role("button", name="Create account").click()
    expect(page).to_have_url(f"{base}/accounts/signup/sent/")
    activate(page, verification_link(stack.worker, base))
    expect(page).to_have_url(f"{base}/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Analytical Engines")
    screenshot(page, journey, "1-dashboard")

    # The offers: the sandbox's A100 pools are simulated, and say so.
    page.goto("/marketplace/offers/")
    spot_offer = page.locator("[data-offer='a100-80gb|us-west|spot']")
    expect(spot_offer.locator(".badge-simulated")).to_have_text("Simulated")
    expect(spot_offer).to_contain_text("8 of 8")
    expect(
        page.locator("[data-offer='a100-80gb|us-west|on_demand'] .badge-simulated")
    ).to_be_visible()
    # An offer with no sandbox node is no "simulated" capacity.
    expect(
        page.locator("[data-offer='h200-141gb|us-west|on_demand'] .badge-simulated")
    ).to_have_count(0)
    # Narrowed to what can run now in us-west: the sandbox's A100, on-demand and spot.
    filters = page.locator("form.filters")
    with page.expect_response(lambda r: "region=us-west" in r.url):
        filters.locator("[name=region]").select_option("us-west")
    with page.expect_response(lambda r: "available=on" in r.url):
        filters.locator("[name=available]").check()
    offers = page.get_by_test_id("offers-table").locator("tbody tr")
    expect(offers).to_have_count(1)
    expect(offers).to_have_attribute("data-group", "a100-80gb|us-west")
    expect(offers.locator(".badge-simulated")).to_have_count(2)
    screenshot(page, journey, "2-offers")

    # Estimate one node of 8×A100-80GB, 70 % on spot, for 24 hours.
    estimate_form = page.locator("form[action='/marketplace/estimate/']")
    estimate_form.locator("[name=gpu_type]").select_option("a100-80gb")
    estimate_form.locator("[name=gpus_per_node]").fill("8")
    estimate_form.locator("[name=nodes]").fill("1")
    estimate_form.locator("[name=region]").select_option("us-west")
    estimate_form.locator("[name=spot_ratio]").fill("0.7")
    estimate_form.locator("[name=hours]").fill("24")
    tenant = Tenant.objects.get(name="Analytical Engines")
    expected = estimate_cost(
        gpu_type=GpuType.objects.get(slug="a100-80gb"),
        region=Region.objects.get(slug="us-west"),
        nodes=1,
        gpus_per_node=8,
        cpus=8,
        spot_ratio=Decimal("0.7"),
        hours=Decimal(24),
        tier="on_demand",
        tenant=tenant,
    )
    expect(page.get_by_test_id("estimate-hourly")).to_have_text(
        f"{expected.hourly} {expected.currency}"
    )
    expect(page.get_by_test_id("estimate-total")).to_have_text(
        f"{expected.total} {expected.currency}"
    )
    # One node can't be 70 % spot: the estimate says so and prices the node as the
    # launch places it, on spot.
    expect(page.get_by_test_id("estimate-split")).to_have_text("1 node: spot")
    expect(page.get_by_test_id("estimate-split-note")).to_contain_text("can't be honoured")
    screenshot(page, journey, "3-estimate")

    # Launch it on the sandbox: a short simulated run that checkpoints every 6 s.
    page.goto("/jobs/launch/")
    form = page.locator("#launch-form")
    form.locator("[name=name]").fill("llama-finetune")
    with page.expect_response(lambda r: "/jobs/launch/options/" in r.url):
        form.locator("[name=gpu_type]").select_option("a100-80gb")
    # The form's choices follow the GPU type (a whole node) before the image is picked.
    expect(form.locator("[name=gpus_per_node]")).to_have_value("8")
    form.locator("[name=image]").select_option(IMAGE)
    form.locator("[name=command]").fill("torchrun --nproc-per-node 8 train.py")
    form.locator("[name=env]").fill("SANDBOX_DURATION_SECONDS=24\nSANDBOX_CHECKPOINT_SECONDS=6")
    form.locator("[name=gpus_per_node]").select_option("8")
    form.locator("[name=cpus]").fill("16")
    form.locator("[name=nodes]").fill("1")
    form.locator("[name=region]").select_option("us-west")
    form.locator("[name=spot_ratio]").fill("0.7")
    form.locator("[name=checkpoint_path]").fill("/ckpt/llama")
    expect(page.locator("#estimate-result [data-testid=estimate-hourly]")).to_have_text(
        f"{expected.hourly} {expected.currency}"
    )
    screenshot(page, journey, "4-launch")
    form.get_by_role("button", name="Launch").click()
    expect(page).to_have_url(re.compile(rf"^{re.escape(base)}/jobs/\d+/$"))
    job = Job.objects.get(name="llama-finetune")
    assert (job.spot_nodes, job.on_demand_nodes, job.gpus_per_node) == (1, 0, 8)

    # It runs on the sandbox; logs and GPU charts move without a reload.
    status = page.get_by_test_id("job-status")
    try:
        expect(status).to_have_text("Running", timeout=STATUS_TIMEOUT_MS)
    except AssertionError as error:
        job.refresh_from_db()
        raise AssertionError(f"{error}\n{job.status} {job.status_reason}\n{stack.logs()}") from None
    expect(page.locator("#job-status h1 .badge-simulated")).to_be_visible()
    log = page.get_by_test_id("log")
    expect_in_log(page, "[sandbox] Simulated workload", job=job, stack=stack, timeout=15_000)
    expect(log).to_contain_text("rank 0/1: 8 GPU(s) visible")
    page.evaluate("window.ggSameDocument = true")
    first_line = highest_line(page)
    wait_until(lambda: highest_line(page) >= first_line + 3, 15, what="new log lines")
    wait_until(lambda: chart_points(page) >= 8, 20, what="GPU readings on the chart")
    points = chart_points(page)
    live_updates = page.evaluate("window.ggJobLive.charts.liveCount")
    wait_until(
        lambda: (
            chart_points(page) > points
            and page.evaluate("window.ggJobLive.charts.liveCount") > live_updates
        ),
        15,
        what="the GPU charts extended live",
    )
    assert page.evaluate("window.ggSameDocument") is True, "the page was reloaded"
    traces = page.evaluate("document.querySelector('[data-chart=utilization]').data.length")
    assert traces == 8, f"{traces} GPU traces, expected one per GPU"
    expect(log).to_contain_text("saved checkpoint /ckpt/llama/step-", timeout=10_000)
    screenshot(page, journey, "5-running")

    # Pause: the sandbox suspends the Job and compute is released.
    page.locator("#job-status").get_by_role("button", name="Pause").click()
    expect(status).to_have_text("Paused", timeout=STATUS_TIMEOUT_MS)
    expect(page.locator("#job-status").get_by_role("button", name="Resume")).to_be_visible()
    screenshot(page, journey, "6-paused")

    # Resume: it goes on from its last checkpoint, and finishes.
    page.locator("#job-status").get_by_role("button", name="Resume").click()
    expect(status).to_have_text("Running", timeout=STATUS_TIMEOUT_MS)
    expect_resumed_in_log(page, "/ckpt/llama", job=job, stack=stack)
    expect(status).to_have_text("Succeeded", timeout=60_000)
    expect(log).to_contain_text("training complete")
    timeline = page.get_by_test_id("timeline")
    for step in ("running", "pausing", "paused", "resuming", "succeeded"):
        expect(timeline).to_contain_text(step)
    cost = money(page.get_by_test_id("job-cost").inner_text())  # to the cent
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED and job.exit_code == 0
    # What it cost: the seconds it held the spot node, at the spot price (never zero,
    # never more than the whole launch-to-finish time would cost).
    hourly_spot = estimate_cost(
        gpu_type=job.gpu_type,
        region=job.region,
        nodes=1,
        gpus_per_node=8,
        cpus=job.cpus,
        spot_ratio=Decimal(1),
        hours=Decimal(1),
        tenant=job.tenant,
    ).hourly
    wall = Decimal(str((job.finished_at - job.created_at).total_seconds()))
    assert Decimal(0) < cost <= hourly_spot * wall / 3600 + Decimal("0.005"), (
        cost,
        hourly_spot,
        wall,
    )
    # A healthy simulated run raises no alert: its memory fills once, then holds, and
    # its checkpoint dips are not "unstable" utilisation.
    assert_no_alerts(page, job)
    screenshot(page, journey, "7-succeeded")
    page.problems.assert_clean()


# --- 2. a budget pauses a running job within one metering tick; raising it resumes -------


def test_budget_pauses_a_running_job_within_one_tick_and_raising_it_resumes(
    stack, browser_page, world, password
):
    page, base = browser_page, stack.server.url
    journey = "2-budget"
    job = launch(world.tenant, world.member, name="nightly-eval")
    wait_for_status(job, JobStatus.RUNNING, stack)

    # The tenant admin sets a small monthly budget: nothing is metered yet, so nothing
    # pauses now.
    page.add_init_script(SOCKET_RECORDER)
    sign_in(page, base, world.admin.email, password)
    page.goto("/billing/budgets/")
    page.locator("[name=name]").fill("GPU research")
    page.locator("[name=amount]").fill("0.01")
    page.locator("[name=thresholds]").fill("50, 80, 100")
    page.locator("[name=action]").select_option("pause_non_critical")
    page.get_by_role("button", name="Create budget").click()
    expect(page.locator("#messages")).to_contain_text("Budget “GPU research” created.")
    expect(page.locator("tr[data-budget='GPU research']")).to_contain_text("0.00 USD / 0.01 USD")
    screenshot(page, journey, "1-budget-set")
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING

    # The admin watches the job list; one metering tick (beat's task, sent now) bills
    # the seconds run so far, crosses the budget and pauses the job.
    page.goto("/jobs/")
    expect(page.locator("html")).to_have_attribute("data-tenant-socket", "open")
    row = page.locator(f"tr[data-job='{job.pk}']")
    expect(row).to_contain_text("Running")
    # 8 on-demand A100s cost about 0.004 USD a second: after 6 s the tick bills more than
    # twice the budget.
    wait_until(lambda: timezone.now() - job.started_at > timedelta(seconds=6), 10, what="6 s")
    page.evaluate("window.ggSameDocument = true")
    tick_sent = timezone.now()
    assert enqueue_now(billing_tasks.meter_tick_task)
    banner = page.locator("#messages .flash", has_text="reached 100 %")
    expect(banner).to_contain_text("GPU research", timeout=15_000)
    expect(row).to_contain_text(re.compile("Pausing|Paused"), timeout=10_000)
    assert page.evaluate("window.ggSameDocument") is True, "the page was reloaded"
    # The tick's threshold crossings, each delivered live to the open page.
    alerts = [m for m in page.evaluate("window.ggReceived") if m.get("scope") == "budget"]
    assert {(m["budget"], m["threshold"]) for m in alerts} == {
        ("GPU research", 50),
        ("GPU research", 80),
        ("GPU research", 100),
    }, alerts
    job = wait_for_status(job, JobStatus.PAUSED, stack, timeout=20)
    assert job.paused_by_budget
    pause = job.events.get(to_status=JobStatus.PAUSING)
    # Paused by that one tick, seconds after it was sent.
    assert pause.actor == "budget"
    assert tick_sent < pause.at < tick_sent + timedelta(seconds=15), (tick_sent, pause.at)
    screenshot(page, journey, "2-paused-banner")

    # The job's page and timeline name the budget.
    page.goto(f"/jobs/{job.pk}/")
    expect(page.get_by_test_id("job-status")).to_have_text("Paused")
    status_card = page.locator(".stat", has=page.get_by_test_id("job-status"))
    expect(status_card).to_contain_text("budget “GPU research” reached 100 %")
    timeline = page.get_by_test_id("timeline")
    expect(timeline.locator("li", has_text="pausing")).to_contain_text(
        "budget “GPU research” reached 100 %"
    )
    screenshot(page, journey, "3-job-paused")

    # Raising the budget resumes the job at once (only the jobs the budget paused).
    page.goto("/billing/budgets/")
    page.locator("tr[data-budget='GPU research']").get_by_role("link", name="Edit").click()
    page.locator("[name=amount]").fill("500")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#messages")).to_contain_text("Budget “GPU research” saved.")
    screenshot(page, journey, "4-budget-raised")
    page.goto(f"/jobs/{job.pk}/")
    expect(page.get_by_test_id("job-status")).to_have_text("Running", timeout=STATUS_TIMEOUT_MS)
    expect(timeline.locator("li", has_text="resuming")).to_contain_text(
        "budget no longer exhausted"
    )
    expect_in_log(
        page, "GPUGEEK_RESUMED=1: resuming from /ckpt/eval", job=job, stack=stack, timeout=30_000
    )
    screenshot(page, journey, "5-resumed")
    page.problems.assert_clean()


# --- 3. staff reclaim spot capacity; the job is preempted and runs again ------------------


def test_staff_reclaim_spot_capacity_and_the_job_resumes_as_a_new_attempt(
    stack, browser_page, chromium_browser, world, password, staff_user
):
    page, base = browser_page, stack.server.url
    journey = "3-spot-reclaim"
    job = launch(
        world.tenant,
        world.member,
        name="llama-spot",
        spot_ratio=Decimal(1),
        checkpoint_path="/ckpt/run",
    )

    page.add_init_script(SOCKET_RECORDER)
    sign_in(page, base, world.member.email, password)
    page.goto(f"/jobs/{job.pk}/")
    status = page.get_by_test_id("job-status")
    expect(status).to_have_text("Running", timeout=STATUS_TIMEOUT_MS)
    log = page.get_by_test_id("log")
    expect(log).to_contain_text("saved checkpoint /ckpt/run/step-", timeout=15_000)
    screenshot(page, journey, "1-running")
    page.evaluate("window.ggSameDocument = true")
    before = highest_line(page)

    # Staff, in their own browser: Platform admin → Sandbox cluster → Reclaim… → confirm.
    staff = watched_page(chromium_browser, base)
    try:
        sign_in(staff, base, staff_user.email, DEFAULT_PASSWORD)
        # The fleet: the spot pool shows the GPU the job holds (issue 32, item 11).
        staff.goto("/jobs/staff/fleet/")
        fleet_pool = staff.get_by_test_id("fleet-pools").locator(f'tr[data-pool="{A100_SPOT}"]')
        expect(fleet_pool.locator("td").nth(4)).not_to_have_text(re.compile(r"^0\b"))
        expect(staff.get_by_test_id("fleet-gpus")).not_to_have_text(re.compile(r"^0 /"))
        screenshot(staff, journey, "2-staff-fleet")
        staff.goto("/jobs/staff/sandbox/")
        pool_row = staff.locator("tr", has_text="A100 80GB SXM · us-west · spot")
        # The node list is the sandbox's own, live: the job's pod is on the spot node.
        node_row = staff.locator("tr", has_text=f"{A100_SPOT}-0")
        expect(node_row.locator("td").nth(4)).to_have_text("1")
        expect(node_row).to_contain_text("Ready")
        screenshot(staff, journey, "3-staff-sandbox")
        pool_row.get_by_role("link", name="Reclaim…").click()
        expect(staff.get_by_role("heading", level=1)).to_contain_text("Reclaim spot capacity")
        # The confirmation names the jobs it hits and their organisation.
        expect(staff.locator("main")).to_contain_text("llama-spot")
        expect(staff.locator("main")).to_contain_text(world.tenant.name)
        screenshot(staff, journey, "4-staff-confirm")
        staff.get_by_role("button", name="Reclaim spot capacity").click()
        expect(staff).to_have_url(f"{base}/jobs/staff/sandbox/")
        expect(staff.locator("#messages")).to_contain_text("reclaimed")
        staff.problems.assert_clean()
    finally:
        staff.context.close()

    # The user's page, live: preempted, then running again as attempt 2.
    wait_until(
        lambda: (
            ("preempted", 1) in received_statuses(page)
            and any(s == "running" and attempt == 2 for s, attempt in received_statuses(page))
        ),
        40,
        what="preempted, then running as attempt 2",
    )
    expect(status).to_have_text("Running", timeout=STATUS_TIMEOUT_MS)
    expect(page.locator(".stat", has_text="Attempt").locator(".stat-value")).to_have_text("2")
    timeline = page.get_by_test_id("timeline")
    preempted = timeline.locator("li", has_text="preempted")
    expect(preempted).to_contain_text(
        re.compile("spot capacity reclaimed|DisruptionTarget|TerminationByKubelet")
    )
    expect(
        timeline.locator("li", has_text="requeued as a new attempt from the checkpoint")
    ).to_contain_text("attempt 2")
    # The log goes on in the same window: the new attempt's lines follow the old ones.
    expect_resumed_in_log(page, "/ckpt/run", job=job, stack=stack)
    rows = shown_lines(page)
    resumed_at = next(n for n, text in rows if "resuming from /ckpt/run" in text)
    assert resumed_at > before
    numbers = [n for n, _ in rows]
    assert numbers == sorted(set(numbers)), "lines out of order or shown twice"
    assert page.evaluate("window.ggSameDocument") is True, "the page was reloaded"
    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.RUNNING, 2)
    assert not job.events.filter(to_status=JobStatus.FAILED).exists()
    # The new attempt trains on (from its checkpoint) and its GPUs chart on.
    points = chart_points(page)
    expect(log.locator(".log-line").last).to_contain_text("epoch", timeout=10_000)
    wait_until(lambda: chart_points(page) > points, 15, what="the new attempt's GPU readings")
    assert_no_alerts(page, job)  # a preemption is no GPU alert
    screenshot(page, journey, "5-running-again")
    page.problems.assert_clean()


# --- 4. a price change published for next hour shows next to today's price ---------------


def test_staff_publish_a_price_change_and_offers_show_both_prices(
    browser_page, chromium_browser, asgi_server, world, password, staff_user
):
    page, base = browser_page, asgi_server.url
    journey = "4-price-change"
    seed_catalog()
    now = timezone.now()
    effective = (now + timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    if effective - now < timedelta(minutes=5):  # "next hour" must still be ahead when checked
        effective += timedelta(hours=1)

    # Staff: Platform admin → Price book; A100-80GB in us-west from 1.79 to 2.19.
    sign_in(page, base, staff_user.email, DEFAULT_PASSWORD)
    page.goto("/marketplace/staff/prices/")
    page.get_by_label("At a later time").check()
    page.locator("[name=effective_from]").fill(effective.strftime("%Y-%m-%dT%H:%M"))
    price_cell = page.locator("input[name='price|a100-80gb|us-west']")
    expect(price_cell).to_have_value(re.compile(r"^1\.790*$"))
    price_cell.fill("2.19")
    page.locator("[name=note]").fill("A100 demand")
    page.get_by_role("button", name="Preview changes").click()
    preview = page.get_by_test_id("price-preview")
    expect(preview.locator("tr.changed")).to_contain_text("2.19")
    screenshot(page, journey, "1-preview")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Publish").click()
    expect(page.locator("#messages")).to_contain_text(f"effective {effective:%Y-%m-%d %H:%M} UTC")
    expect(page.locator("tbody tr", has_text="A100 demand")).to_contain_text("scheduled")
    screenshot(page, journey, "2-published")

    # A customer's offers page: today's price, and the new one from next hour.
    customer = watched_page(chromium_browser, base)
    try:
        sign_in(customer, base, world.member.email, password)
        customer.goto("/marketplace/offers/?region=us-west&min_memory_gib=80")
        when = f"from {effective:%Y-%m-%d %H:%M} UTC"
        on_demand = customer.locator("[data-offer='a100-80gb|us-west|on_demand']")
        expect(on_demand).to_contain_text("1.7900 USD")
        expect(on_demand.get_by_test_id("next-price")).to_have_text(f"{when}: 2.1900 USD")
        # Spot follows with the version's discount (55 %): 0.8055 now, 0.9855 then.
        spot = customer.locator("[data-offer='a100-80gb|us-west|spot']")
        expect(spot).to_contain_text("0.8055 USD")
        expect(spot.get_by_test_id("next-price")).to_have_text(f"{when}: 0.9855 USD")
        # Offers whose price doesn't change show one price.
        h100 = customer.locator("[data-offer='h100-80gb|us-west|on_demand']")
        expect(h100.get_by_test_id("next-price")).to_have_count(0)
        expect(customer.get_by_test_id("estimate-total")).to_be_visible()
        screenshot(customer, journey, "3-offers-both-prices")
        customer.problems.assert_clean()
    finally:
        customer.context.close()
    page.problems.assert_clean()
