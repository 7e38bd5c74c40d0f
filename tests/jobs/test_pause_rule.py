"""Which jobs can be paused is one rule (`jobs.models.PAUSABLE`): the state machine, the
pause service and the job page's Pause button all follow it."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs import services
from jobs.actors import BACKEND, Actor
from jobs.models import PAUSABLE, JobStatus
from jobs.state import TRANSITIONS
from tests.conftest import signed_in_client
from tests.jobs_helpers import advance_to, submit

pytestmark = pytest.mark.django_db


def test_pausable_is_where_the_state_machine_allows_pausing():
    assert {s for s, targets in TRANSITIONS.items() if JobStatus.PAUSING in targets} == PAUSABLE


@pytest.mark.parametrize("status", sorted(PAUSABLE))
def test_the_job_page_offers_pause_where_a_pause_is_allowed(world, catalog, status):
    job = advance_to(submit(world, "train"), status, actor=BACKEND)
    assert job.can_pause
    page = signed_in_client(world.member, world.tenant).get(reverse("jobs:detail", args=[job.pk]))
    assert reverse("jobs:action", args=[job.pk, "pause"]) in page.content.decode()
    services.job_pause(job=job, actor=Actor.of_user(world.member))
    assert job.status == JobStatus.PAUSING


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.PAUSED, JobStatus.SUCCEEDED])
def test_no_pause_button_and_a_refusal_elsewhere(world, catalog, status):
    job = submit(world, "train")
    if status != JobStatus.QUEUED:
        job = advance_to(job, status, actor=BACKEND)
    assert not job.can_pause
    page = signed_in_client(world.member, world.tenant).get(reverse("jobs:detail", args=[job.pk]))
    assert reverse("jobs:action", args=[job.pk, "pause"]) not in page.content.decode()
    if status != JobStatus.PAUSED:  # pausing a paused job is a no-op, not a refusal
        with pytest.raises(services.ActionRefused):
            services.job_pause(job=job, actor=Actor.of_user(world.member))
