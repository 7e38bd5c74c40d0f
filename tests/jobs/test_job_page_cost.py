"""A running job's page keeps its cost to date live: the cost card refreshes itself (an
htmx partial of the job page) while the job runs, and stops once it has finished, when
the card says its total and run time instead of a rate."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

from django.urls import reverse
from django.utils import timezone

from jobs.models import JobStatus
from tests.conftest import signed_in_client
from tests.jobs_helpers import advance_to, at_time, submit

COST = re.compile(r'data-testid="job-cost">([\d,]+\.\d\d) USD<')


def cost_card(client, job):
    response = client.get(
        reverse("jobs:detail", args=[job.pk]), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-cost"
    )
    assert response.status_code == 200
    return response.content.decode()


def test_a_running_jobs_cost_card_refreshes_itself_until_it_finishes(world, catalog):
    client = signed_in_client(world.member, world.tenant)
    started = timezone.now() - timedelta(hours=2)
    with at_time(started):  # launched then, so its timeline is in order
        job = submit(world, "costly", region="local", cpus=8)
    advance_to(job, JobStatus.RUNNING, at=started)

    page = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    (card,) = re.findall(r'<div id="job-cost"[^>]*>', page)
    assert 'hx-trigger="every 10s"' in card and 'hx-target="#job-cost"' in card

    now = cost_card(client, job)
    assert now.strip().startswith('<div id="job-cost"')  # the card alone, not the page
    assert "<h1>" not in now and "per hour while running" in now
    with at_time(timezone.now() + timedelta(hours=10)):
        later = cost_card(client, job)
    first, second = (Decimal(COST.search(c)[1].replace(",", "")) for c in (now, later))
    assert second > first > 0  # the figure moves between metering ticks

    advance_to(job, JobStatus.SUCCEEDED, at=started + timedelta(minutes=90))
    done = cost_card(client, job)
    assert "hx-trigger" not in done  # finished: nothing to refresh
    assert "per hour while running" not in done
    assert '<span class="stat-label">Cost</span>' in done
    assert 'data-testid="job-run-time">Run time 1 h 30 min<' in done


def test_another_tenant_gets_404_for_the_cost_card(world, other_world, catalog):
    job = submit(world, "mine", region="local")
    stranger = signed_in_client(other_world.member, other_world.tenant)
    response = stranger.get(
        reverse("jobs:detail", args=[job.pk]), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-cost"
    )
    assert response.status_code == 404
