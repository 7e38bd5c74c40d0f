"""Who acted on a job: the timeline stores a kind and, for a person, the user; the job
page names the person, the API keeps its one-word `actor` beside `actor_kind`."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from billing import dbviews
from jobs.actors import BACKEND, BUDGET, ActorKind
from jobs.models import Job, JobEvent, JobStatus
from jobs.selectors import job_events
from jobs.services import job_pause_once
from tests.conftest import signed_in_client
from tests.jobs_helpers import advance_to, submit

pytestmark = pytest.mark.django_db


def timeline(client, job: Job) -> str:
    page = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    return page[page.index('data-testid="timeline"') :].split("</ol>")[0]


def test_a_persons_pause_names_that_person_in_the_timeline(world, catalog):
    world.member.full_name = "Ada Lovelace"
    world.member.save()
    member = signed_in_client(world.member, world.tenant)
    job = advance_to(submit(world, "train"), JobStatus.RUNNING, actor=BACKEND)
    response = member.post(reverse("jobs:action", args=[job.pk, "pause"]))
    assert response.status_code == 302
    pausing = JobEvent.objects.get(job=job, to_status=JobStatus.PAUSING)
    assert (pausing.actor_kind, pausing.actor_user) == (ActorKind.USER, world.member)
    assert pausing.actor == world.member.email
    shown = timeline(member, job)
    assert f"Ada Lovelace &lt;{world.member.email}&gt;" in shown
    assert "/django-admin/" not in shown  # the admin link is for staff only


def test_a_budget_pause_shows_budget(world, catalog):
    job = advance_to(submit(world, "train"), JobStatus.RUNNING, actor=BACKEND)
    assert job_pause_once(job=job, actor=BUDGET, reason="budget reached 100 %")
    pausing = JobEvent.objects.get(job=job, to_status=JobStatus.PAUSING)
    assert (pausing.actor_kind, pausing.actor_user, pausing.actor) == ("budget", None, "budget")
    shown = timeline(signed_in_client(world.member, world.tenant), job)
    assert '<span class="muted" data-actor-kind="budget">budget</span>' in shown


def test_a_deleted_persons_events_stay_as_a_user_without_one(world, catalog):
    job = submit(world, "train")  # "submitted" by world.member
    world.member.delete()
    submitted = JobEvent.objects.get(job=job, reason="submitted")
    assert (submitted.actor_kind, submitted.actor_user, submitted.actor) == (
        ActorKind.USER,
        None,
        "deleted user",
    )


def test_the_timeline_reads_its_people_in_one_query(world, catalog, django_assert_num_queries):
    job = advance_to(submit(world, "train"), JobStatus.RUNNING, actor=BACKEND)
    with django_assert_num_queries(1):
        actors = [e.actor for e in job_events(job=job)]
    assert actors[0] == world.member.email and actors[-1] == "backend"


@pytest.mark.django_db(transaction=True)
def test_the_migration_turns_labels_into_kinds_and_e_mails_into_users(world, catalog):
    job = submit(world, "train")
    before, after = [("jobs", "0009_job_dispatch_claim")], [("jobs", "0010_jobevent_actor_kind")]
    executor = MigrationExecutor(connection)
    # Going back rebuilds the job tables (SQLite): billing's views over them go first and
    # come back after, as `migrate` does with its pre/post_migrate hooks.
    dbviews.drop_views(using=connection.alias)
    try:
        executor.migrate(before)
        old = executor.loader.project_state(before).apps.get_model("jobs", "JobEvent")
        old.objects.all().delete()
        labels = [world.member.email.upper(), "gone@nowhere.test", "alerts", "budget", "system"]
        for label in labels:
            old.objects.create(job_id=job.pk, actor=label, from_status="queued")
        executor = MigrationExecutor(connection)
        executor.migrate(after)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        dbviews.create_views(using=connection.alias)
    converted = [(e.actor_kind, e.actor_user_id) for e in JobEvent.objects.order_by("pk")]
    assert converted == [
        ("user", world.member.pk),
        ("user", None),
        ("alert", None),
        ("budget", None),
        ("system", None),
    ]
