"""The dashboard leads with money (issue 32, "Also"): this month's spend, the burn rate of
what runs now, the month-end forecast, credit (for those who see invoices) and budgets."""

from __future__ import annotations

from decimal import Decimal

from django.urls import reverse
from django.utils import timezone

from billing.budgets.services import budget_create, meter_and_enforce
from jobs.models import JobStatus
from tests.billing.conftest import give_credit, make_job, set_status
from tests.conftest import signed_in_client

CPU_PRICE = Decimal("0.0125")  # demo price per vCPU-hour in region "local"


def dashboard(user, world) -> str:
    return signed_in_client(user, world.tenant).get(reverse("dashboard")).content.decode()


def test_the_dashboard_leads_with_this_months_money(world, catalog):
    now = timezone.now()
    job = make_job(world, name="train", cpus=4, start=now)
    set_status(job, JobStatus.RUNNING, now)
    meter_and_enforce(now=now)
    give_credit(world.tenant, "25.00")
    budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=Decimal(100))

    html = dashboard(world.owner, world)

    panel = html.split('data-testid="dashboard-money"', 1)[1].split("</section>", 1)[0]
    assert html.index('data-testid="dashboard-money"') < html.index('aria-label="Summary"')
    burn = (4 * CPU_PRICE).quantize(Decimal("0.01"))
    assert f'data-testid="money-burn">{burn} USD/h<' in panel
    assert 'data-testid="money-credit">25.00 USD<' in panel
    assert "Team cap" in panel and "of 100.00 USD" in panel
    assert 'data-testid="money-mtd">' in panel


def test_credit_is_shown_only_to_those_who_see_invoices(world, catalog):
    html = dashboard(world.viewer, world)
    assert 'data-testid="dashboard-money"' in html
    assert 'data-testid="money-credit"' not in html
    assert "No budget yet" in html


def test_the_live_job_list_refresh_carries_no_money_panel(world, catalog):
    client = signed_in_client(world.member, world.tenant)
    partial = client.get(
        reverse("dashboard"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="dashboard-jobs"
    )
    assert partial.status_code == 200
    assert "dashboard-money" not in partial.content.decode()
