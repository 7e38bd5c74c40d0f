"""Budgets: threshold alerts once per period, auto-pause at 100 %, launch blocking, resume
of exactly the jobs a budget paused, scope, concurrency, bad input and the signed webhook.

Alerts are checked on a fixed timeline (an alert-only budget, a month inside the price
book). Pausing goes through the job state machine, which stamps events with the wall
clock, so those tests run in the current month: their jobs started ten minutes ago.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

import billing.budgets.services
from billing.budgets import services
from billing.budgets.selectors import budget_statuses
from billing.budgets.services import (
    budget_create,
    budget_delete,
    budget_enforce,
    budget_update,
    meter_and_enforce,
)
from billing.metering import meter_tick
from billing.models import Budget, BudgetAlert, UsageRecord
from billing.selectors import period_end, period_start
from console.models import AuditEvent, Notification
from console.service_errors import ServiceError
from jobs.actors import Actor
from jobs.backends import Observation
from jobs.models import Job, JobEvent, JobStatus
from jobs.services import job_apply_observation, job_pause, job_resume
from marketplace.models import PriceVersion
from tests.billing.conftest import make_job, set_status
from tests.concurrency import run_at_once
from tests.conftest import signed_in_client, token_client
from tests.jobs_helpers import at_time

CPU_PRICE = Decimal("0.0125")  # demo price per vCPU-hour in region "local"
TINY = "0.000001"  # the smallest budget: any usage exhausts it


def running_job(world, *, name, since, priority="normal", project=""):
    """A 1-vCPU job submitted just before `since` and running since then."""
    job = make_job(world, name=name, priority=priority, project=project, start=since)
    return set_status(job, JobStatus.RUNNING, since)


def ten_minutes_ago(now):
    """Usage that stays inside the current period (whatever the day of the month)."""
    return max(now - timedelta(minutes=10), period_start(now))


def suspended(job) -> Job:
    """What the watcher does when the backend reports the pause done."""
    job.refresh_from_db()
    return job_apply_observation(job=job, observation=Observation(phase="suspended"))


def alerts(budget) -> set[tuple[int, str]]:
    return set(BudgetAlert.objects.filter(budget=budget).values_list("threshold", "kind"))


# --- thresholds ----


def test_each_threshold_alerts_once_per_period(world, catalog):
    first = PriceVersion.objects.order_by("effective_from").first()
    month = period_start(first.effective_from + timedelta(days=40))
    start = month + timedelta(days=1, hours=10)  # a month fully inside the price book
    budget = budget_create(
        tenant=world.tenant,
        user=world.owner,
        name="Monthly cap",
        amount=CPU_PRICE,  # one vCPU-hour: 50 % at 30 min, 80 % at 48 min, 100 % at 60 min
        thresholds=[100, 50, 80],
        action="alert_only",
    )
    job = running_job(world, name="train", since=start)
    crossed_at = {}
    for minutes in range(5, 85, 5):
        now = start + timedelta(minutes=minutes)
        meter_and_enforce(now=now)
        meter_and_enforce(now=now)  # a repeated tick alerts nothing more
        for threshold, kind in alerts(budget):
            if kind == "actual":
                crossed_at.setdefault(threshold, minutes)
    assert crossed_at == {50: 30, 80: 50, 100: 60}
    # The forecast (the job to its 24-hour max runtime) passed every threshold at the
    # first tick, but spend crossed each before the forecast had held for an hour: only
    # actual alerts (test_budget_forecast covers forecast alerts).
    in_month = BudgetAlert.objects.filter(budget=budget, period_start=month)
    assert sorted(in_month.values_list("threshold", "kind")) == [
        (50, "actual"), (80, "actual"), (100, "actual")
    ]  # fmt: skip
    hundred = BudgetAlert.objects.get(budget=budget, threshold=100, kind="actual")
    # Twelve 5-minute records, each rounded to 1e-9 once: the ledger's exact sum.
    assert hundred.spend == sum(r.amount for r in UsageRecord.objects.filter(job=job)[:12])
    assert abs(hundred.spend - CPU_PRICE) < Decimal("0.00000001")
    # Owner, admin and finance hear of each crossing once; members and viewers don't.
    for user in (world.owner, world.admin, world.finance):
        assert Notification.objects.filter(user=user).count() == 3
    for user in (world.member, world.viewer):
        assert not Notification.objects.filter(user=user, title__contains="Budget").exists()
    titles = set(Notification.objects.filter(user=world.owner).values_list("title", flat=True))
    assert "Budget “Monthly cap” reached 100 %" in titles
    assert AuditEvent.objects.filter(action="budget.threshold_actual").count() == 3
    # An alert-only budget never pauses.
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING

    # A new month: each threshold alerts again, once.
    next_month = period_end(start)
    for hours in (2, 3):
        meter_and_enforce(now=next_month + timedelta(hours=hours))
    new = BudgetAlert.objects.filter(budget=budget, period_start=next_month, kind="actual")
    assert sorted(new.values_list("threshold", flat=True)) == [50, 80, 100]
    assert BudgetAlert.objects.filter(budget=budget, period_start=month).count() == 3


# --- pause at 100 % ----


@pytest.fixture
def exhausted(world, catalog):
    """Two running jobs (one critical), a pause budget, and the tick that exhausts it."""
    now = timezone.now()
    since = ten_minutes_ago(now)
    train = running_job(world, name="train", since=since)
    serve = running_job(world, name="serve", since=since, priority="critical")
    budget = budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
    assert Job.objects.get(pk=train.pk).status == JobStatus.RUNNING  # no spend yet
    meter_and_enforce(now=now)
    train.refresh_from_db()
    serve.refresh_from_db()
    return budget, train, serve


def test_at_100_percent_non_critical_jobs_pause_and_critical_keep_running(world, exhausted):
    budget, train, serve = exhausted
    assert train.status == JobStatus.PAUSING and train.paused_by_budget
    assert "budget" in train.status_reason and "Team cap" in train.status_reason
    pausing = JobEvent.objects.get(job=train, to_status=JobStatus.PAUSING)
    assert pausing.actor == "budget"
    train = suspended(train)
    assert train.status == JobStatus.PAUSED and train.paused_by_budget
    assert "budget" in train.status_reason and "Team cap" in train.status_reason
    assert serve.status == JobStatus.RUNNING and not serve.paused_by_budget
    # The 100 % alert names the critical job that keeps running.
    note = Notification.objects.get(user=world.owner, title="Budget “Team cap” reached 100 %")
    assert "Critical jobs keep running: serve" in note.body
    assert note.level == "error"
    assert AuditEvent.objects.filter(action="job.paused_by_budget", target_id=str(train.pk)).count()
    # Repeated ticks don't pause again or alert again.
    for _ in range(2):
        meter_and_enforce(now=timezone.now())
    assert JobEvent.objects.filter(job=train, to_status=JobStatus.PAUSING).count() == 1
    assert BudgetAlert.objects.filter(budget=budget, threshold=100, kind="actual").count() == 1


def test_new_non_critical_launches_are_refused(world, exhausted):
    with pytest.raises(ServiceError) as refused:
        make_job(world, name="another")
    assert refused.value.code == "payment_required"
    assert "Team cap" in refused.value.message
    critical = make_job(world, name="urgent", priority="critical")
    assert critical.status in (JobStatus.QUEUED, JobStatus.DISPATCHING)

    api = token_client(world.member, world.tenant)
    job = {"name": "api job", "image": "python-3.11", "command": ["true"], "cpus": 1}
    response = api.post("/api/v1/jobs", job, format="json")
    assert response.status_code == 402, response.content
    assert "Team cap" in response.json()["detail"]
    admin_api = token_client(world.admin, world.tenant)  # critical: owners and admins only
    response = admin_api.post("/api/v1/jobs", {**job, "priority": "critical"}, format="json")
    assert response.status_code == 201, response.content


def test_raising_the_budget_resumes_only_what_it_paused(world, catalog):
    now = timezone.now()
    since = ten_minutes_ago(now)
    train = running_job(world, name="train", since=since)
    mine = running_job(world, name="mine", since=since)
    job_pause(job=mine, actor=Actor.of_user(world.member))  # the user's own pause
    mine = suspended(mine)
    budget = budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
    meter_and_enforce(now=now)
    train = suspended(train)
    assert train.status == JobStatus.PAUSED and train.paused_by_budget

    budget_update(budget=budget, user=world.finance, amount="1000")
    train.refresh_from_db()
    mine.refresh_from_db()
    assert train.status == JobStatus.RESUMING and not train.paused_by_budget
    assert JobEvent.objects.get(job=train, to_status=JobStatus.RESUMING).actor == "budget"
    assert mine.status == JobStatus.PAUSED  # a job the user paused stays paused
    assert AuditEvent.objects.filter(action="job.resumed_by_budget").count() == 1
    # Launches are allowed again.
    assert make_job(world, name="again").status in (JobStatus.QUEUED, JobStatus.DISPATCHING)


def test_deleting_the_budget_resumes_the_jobs_it_paused(world, exhausted):
    budget, train, _ = exhausted
    train = suspended(train)
    budget_delete(budget=budget, user=world.owner)
    train.refresh_from_db()
    assert train.status == JobStatus.RESUMING
    assert AuditEvent.objects.filter(action="budget.deleted").exists()


def test_a_new_period_resumes_the_jobs_it_paused(world, exhausted):
    _, train, _ = exhausted
    train = suspended(train)
    budget_enforce(tenant=world.tenant, now=timezone.now())
    assert Job.objects.get(pk=train.pk).status == JobStatus.PAUSED  # still this month
    next_month = period_end(timezone.now()) + timedelta(minutes=1)
    # The resume asks the budget again (as a launch would), at the clock's time: the new
    # month's, as it would be for a real tick.
    with at_time(next_month):
        budget_enforce(tenant=world.tenant, now=next_month)
    assert Job.objects.get(pk=train.pk).status == JobStatus.RESUMING


# --- resume under a used-up budget ----


def test_resuming_a_job_the_budget_paused_is_refused_like_a_launch(world, exhausted):
    """A resume takes compute (and is billed) again: the budget refuses it as it refuses
    a launch, in the API (402 naming the budget) and on the job page, every time."""
    _, train, _ = exhausted
    train = suspended(train)
    meter_and_enforce(now=timezone.now())  # bills the pausing time, up to the release
    records = UsageRecord.objects.filter(job=train).count()
    api = token_client(world.member, world.tenant)
    for _ in range(2):  # again on every resume
        response = api.post(f"/api/v1/jobs/{train.pk}/resume")
        assert response.status_code == 402, response.content
        assert response.json()["code"] == "payment_required"
        assert "Budget “Team cap” is used up" in response.json()["detail"]

    page = signed_in_client(world.member, world.tenant).post(
        f"/jobs/{train.pk}/resume/", follow=True
    )
    assert page.status_code == 200
    assert "Budget “Team cap” is used up" in page.content.decode()
    assert 'class="flash flash-error"' in page.content.decode()

    train.refresh_from_db()
    assert train.status == JobStatus.PAUSED and train.paused_by_budget
    assert not JobEvent.objects.filter(job=train, to_status=JobStatus.RESUMING).exists()
    meter_and_enforce(now=timezone.now())
    assert UsageRecord.objects.filter(job=train).count() == records  # nothing billed since


def test_a_job_its_user_paused_stays_paused_under_a_used_up_budget(world, catalog):
    now = timezone.now()
    since = ten_minutes_ago(now)
    mine = running_job(world, name="mine", since=since)
    serve = running_job(world, name="serve", since=since, priority="critical")
    for job in (mine, serve):
        job_pause(job=job, actor=Actor.of_user(world.owner))
    mine, serve = suspended(mine), suspended(serve)
    budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
    meter_and_enforce(now=now)

    with pytest.raises(ServiceError) as refused:
        job_resume(job=mine, actor=Actor.of_user(world.member))
    assert refused.value.code == "payment_required" and "Team cap" in refused.value.message
    assert Job.objects.get(pk=mine.pk).status == JobStatus.PAUSED
    # A critical job is outside the budget's pause, for a resume as for a launch.
    response = token_client(world.admin, world.tenant).post(f"/api/v1/jobs/{serve.pk}/resume")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == JobStatus.RESUMING


def test_a_project_budget_counts_and_pauses_only_its_project(world, catalog):
    now = timezone.now()
    since = ten_minutes_ago(now)
    vision = running_job(world, name="vision-train", since=since, project="vision")
    nlp = running_job(world, name="nlp-train", since=since, project="nlp")
    meter_tick(now=now)
    vision_spend = sum(r.amount for r in UsageRecord.objects.filter(project="vision"))
    assert vision_spend > 0
    # Above the project's spend but below the tenant's: nothing happens.
    budget = budget_create(
        tenant=world.tenant,
        user=world.owner,
        name="Vision",
        amount=(vision_spend * Decimal("1.5")).quantize(Decimal(TINY)),
        project="vision",
    )
    assert Job.objects.get(pk=vision.pk).status == JobStatus.RUNNING
    status = next(s for s in budget_statuses(tenant=world.tenant) if s.budget == budget)
    assert status.spend == vision_spend
    # Below the project's spend: only the project's job pauses, only its launches stop.
    budget_update(budget=budget, user=world.owner, amount=TINY)
    assert Job.objects.get(pk=vision.pk).status == JobStatus.PAUSING
    assert Job.objects.get(pk=nlp.pk).status == JobStatus.RUNNING
    with pytest.raises(ServiceError):
        make_job(world, name="vision-2", project="vision")
    assert make_job(world, name="nlp-2", project="nlp").project == "nlp"


@pytest.mark.django_db(transaction=True)
def test_concurrent_enforcement_pauses_each_job_once(world, catalog):
    """Two ticks' enforcement at once (threads, each with its own connection). On
    PostgreSQL this races on the row locks; SQLite serialises the writers."""
    now = timezone.now()
    since = ten_minutes_ago(now)
    jobs = [running_job(world, name=f"train-{n}", since=since) for n in range(3)]
    budget = budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
    meter_tick(now=now)
    run_at_once(lambda: budget_enforce(tenant=world.tenant, now=now))
    budget_enforce(tenant=world.tenant, now=now)  # and a third, afterwards
    for job in jobs:
        job.refresh_from_db()
        assert job.status == JobStatus.PAUSING
        assert JobEvent.objects.filter(job=job, to_status=JobStatus.PAUSING).count() == 1
    assert BudgetAlert.objects.filter(budget=budget, kind="actual", threshold=100).count() == 1
    reached = Notification.objects.filter(user=world.owner, title__contains="reached 100 %")
    assert reached.count() == 1


def test_a_racing_enforcement_does_not_audit_the_pause_twice(world, catalog, monkeypatch):
    """The interleaving of two ticks made deterministic: the second tick's list of running
    jobs is read before the first tick's pause commits."""
    now = timezone.now()
    train = running_job(world, name="train", since=ten_minutes_ago(now))
    budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
    meter_tick(now=now)
    real_pause = billing.budgets.services.job_pause_once
    raced = []

    def pause_after_the_other_tick(**kwargs):
        if not raced:
            raced.append(True)
            monkeypatch.setattr(billing.budgets.services, "job_pause_once", real_pause)
            budget_enforce(tenant=world.tenant, now=now)  # the other tick wins the race
        return real_pause(**kwargs)

    monkeypatch.setattr(billing.budgets.services, "job_pause_once", pause_after_the_other_tick)
    paused = budget_enforce(tenant=world.tenant, now=now)
    assert JobEvent.objects.filter(job=train, to_status=JobStatus.PAUSING).count() == 1
    audits = AuditEvent.objects.filter(action="job.paused_by_budget", target_id=str(train.pk))
    assert audits.count() == 1
    assert paused == []  # this tick paused nothing


# --- bad input ----


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"amount": "0"}, "amount", "more than zero"),
        ({"amount": "-5"}, "amount", "more than zero"),
        ({"amount": "lots"}, "amount", "is a number"),
        ({"amount": "NaN"}, "amount", "more than zero"),
        ({"amount": "1.1234567"}, "amount", "6 decimal places"),
        ({"thresholds": [0, 50]}, "thresholds", "1 to 200"),
        ({"thresholds": [50, 201]}, "thresholds", "1 to 200"),
        ({"thresholds": [50.5]}, "thresholds", "whole percents"),
        ({"thresholds": ["50"]}, "thresholds", "whole percents"),
        ({"thresholds": [True]}, "thresholds", "whole percents"),
        ({"thresholds": []}, "thresholds", "whole percents"),
        ({"thresholds": "50,80"}, "thresholds", "whole percents"),
        ({"action": "shutdown"}, "action", "pause_non_critical or alert_only"),
        ({"name": "  "}, "name", "name"),
    ],
)
def test_bad_budget_input_is_refused_with_a_clear_error(world, catalog, changes, field, message):
    values = {"name": "Cap", "amount": "100", "thresholds": [50, 80, 100]} | changes
    with pytest.raises(ServiceError) as refused:
        budget_create(tenant=world.tenant, user=world.owner, **values)
    assert refused.value.field == field
    assert message.lower() in refused.value.message.lower()
    assert not Budget.objects.exists()


def test_budget_names_are_unique_per_tenant(world, other_world, catalog):
    budget_create(tenant=world.tenant, user=world.owner, name="Cap", amount="100")
    with pytest.raises(ServiceError) as refused:
        budget_create(tenant=world.tenant, user=world.owner, name="Cap", amount="5")
    assert (refused.value.code, refused.value.field) == ("conflict", "name")
    other = budget_create(tenant=world.tenant, user=world.owner, name="Other", amount="5")
    with pytest.raises(ServiceError) as refused:
        budget_update(budget=other, user=world.owner, name="Cap")
    assert refused.value.code == "conflict"
    # Another tenant may use the same name.
    budget_create(tenant=other_world.tenant, user=other_world.owner, name="Cap", amount="1")


def test_the_budgets_page_creates_and_refuses(world, catalog):
    owner = signed_in_client(world.owner, world.tenant)
    form = {"name": "Cap", "amount": "250.5", "thresholds": "50, 80, 100", "action": "alert_only"}
    response = owner.post("/billing/budgets/", {**form, "thresholds": "50, 300"})
    assert response.status_code == 200
    assert "1 to 200" in response.content.decode()
    response = owner.post("/billing/budgets/", {**form, "amount": "0"})
    assert response.status_code == 200 and not Budget.objects.exists()
    response = owner.post("/billing/budgets/", form)
    assert response.status_code == 302
    budget = Budget.objects.get()
    assert (budget.amount, budget.thresholds, budget.action) == (
        Decimal("250.5"),
        [50, 80, 100],
        "alert_only",
    )
    # Members see budgets but can't change them.
    member = signed_in_client(world.member, world.tenant)
    page = member.get("/billing/budgets/")
    assert page.status_code == 200 and "Cap" in page.content.decode()
    assert member.post("/billing/budgets/", {**form, "name": "Mine"}).status_code == 403
    assert member.post(f"/billing/budgets/{budget.pk}/", form).status_code == 403
    assert member.post(f"/billing/budgets/{budget.pk}/delete/").status_code == 403
    # Finance may.
    finance = signed_in_client(world.finance, world.tenant)
    response = finance.post(f"/billing/budgets/{budget.pk}/", {**form, "amount": "300"})
    assert response.status_code == 302
    assert Budget.objects.get().amount == Decimal(300)
    assert finance.post(f"/billing/budgets/{budget.pk}/delete/").status_code == 302
    assert not Budget.objects.exists()


# --- webhook ----


class Receiver(BaseHTTPRequestHandler):
    received: list[tuple] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.headers, body))  # header names are case-insensitive
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver(settings):
    # A receiver on this host is a loopback address: allowed only with the opt-in.
    settings.BUDGET_WEBHOOK_ALLOW_PRIVATE = True
    Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/budget", Receiver.received
    finally:
        server.shutdown()
        server.server_close()


def test_webhook_is_a_signed_post(world, catalog, receiver):
    url, received = receiver
    budget = budget_create(
        tenant=world.tenant, user=world.owner, name="Cap", amount="10", webhook_url=url
    )
    payload = {"budget": "Cap", "threshold": 80, "kind": "actual", "spend": "8.1"}
    assert services.budget_webhook_send(budget=budget, payload=payload) == 204
    [(headers, body)] = received
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == payload
    secret = budget.new_webhook_secret  # shown once, when the URL was set
    assert secret
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    assert headers["X-GpuGeek-Signature"] == expected
    assert expected == services.webhook_signature(body, secret=secret)
    budget.webhook_url = "file:///etc/passwd"
    with pytest.raises(ServiceError):
        services.budget_webhook_send(budget=budget, payload=payload)


def test_a_threshold_crossing_sends_the_webhook_after_commit(
    world, catalog, receiver, tasks_in_process, django_capture_on_commit_callbacks
):
    url, received = receiver
    now = timezone.now()
    running_job(world, name="train", since=ten_minutes_ago(now))
    budget = budget_create(
        tenant=world.tenant,
        user=world.owner,
        name="Cap",
        amount=TINY,
        thresholds=[100],
        action="alert_only",
        webhook_url=url,
    )
    with django_capture_on_commit_callbacks(execute=True):
        meter_and_enforce(now=now)
    sent = [json.loads(body) for _, body in received if json.loads(body)["kind"] == "actual"]
    assert len(sent) == 1
    assert sent[0]["budget"] == "Cap" and sent[0]["threshold"] == 100
    assert Decimal(sent[0]["spend"]) > Decimal(sent[0]["amount"]) == Decimal(TINY)
    headers = next(h for h, b in received if json.loads(b)["kind"] == "actual")
    body = next(b for h, b in received if json.loads(b)["kind"] == "actual")
    assert headers["X-GpuGeek-Signature"] == services.webhook_signature(
        body, secret=budget.new_webhook_secret
    )
