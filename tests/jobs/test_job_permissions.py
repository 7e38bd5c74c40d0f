"""Who may act on which job or launch template (console.permissions.job_action_refusal,
template_change_refusal): members on their own, owners and admins on any, a critical job
only owners and admins, viewers and finance on none; another tenant's is a 404. Checked
through the API (the SDK's endpoints), the pages and what the pages show."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.permissions import (
    CRITICAL_JOB_REFUSAL,
    NO_ROLE_TO_ACT,
    OTHERS_JOB_REFUSAL,
    OTHERS_TEMPLATE_REFUSAL,
)
from jobs import services
from jobs.models import Job, JobStatus, LaunchTemplate
from tests.conftest import signed_in_client, token_client
from tests.jobs_helpers import advance_to, submit

ROLES = ("owner", "admin", "member", "viewer", "finance")
# The status each action needs, and what the API answers when it is allowed.
ACTIONS = {
    "pause": (JobStatus.RUNNING, 200),
    "resume": (JobStatus.PAUSED, 200),
    "cancel": (JobStatus.RUNNING, 200),
    "delete": (JobStatus.FAILED, 204),
    "clone": (JobStatus.RUNNING, 201),
}
# Who launched the job acted on: the actor ("own"), someone else ("other": the member
# for owners and admins, the owner for the others), or an admin's critical job.
WHOSE = ("own", "other", "critical")
ALLOWED = {
    "owner": {"own", "other", "critical"},
    "admin": {"own", "other", "critical"},
    "member": {"own"},
    "viewer": set(),
    "finance": set(),
}


def launched_by(world, whose: str, role: str):
    if whose == "critical":
        return world.admin
    if whose == "own":
        return getattr(world, role)
    return world.member if role in ("owner", "admin") else world.owner


def job_for(world, *, role: str, whose: str, status: str) -> Job:
    """A job launched through the service (a viewer's or finance's "own" job was launched
    when they could still launch), moved to `status` through the state machine."""
    job = submit(
        world,
        f"{whose} job",
        user=launched_by(world, whose, role),
        priority="critical" if whose == "critical" else "normal",
    )
    return advance_to(job, status)


def expected_refusal(role: str, whose: str) -> str:
    if role in ("viewer", "finance"):
        return NO_ROLE_TO_ACT
    return CRITICAL_JOB_REFUSAL if whose == "critical" else OTHERS_JOB_REFUSAL


@pytest.mark.parametrize("whose", WHOSE)
@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("role", ROLES)
def test_api_actions_by_role_and_launcher(world, catalog, role, action, whose):
    status, allowed_status = ACTIONS[action]
    job = job_for(world, role=role, whose=whose, status=status)
    api = token_client(getattr(world, role), world.tenant)
    url = f"/api/v1/jobs/{job.pk}"
    response = api.delete(url) if action == "delete" else api.post(f"{url}/{action}")

    if whose in ALLOWED[role]:
        assert response.status_code == allowed_status, response.content
        return
    assert response.status_code == 403, response.content
    error = response.json()
    assert error["code"] == "permission_denied"
    if role in ("viewer", "finance"):  # refused by their role before the job is read
        assert error["detail"]
    else:
        assert error["detail"] == expected_refusal(role, whose)
    job.refresh_from_db()
    assert job.status == status  # untouched
    assert Job.objects.count() == 1  # no clone


@pytest.mark.parametrize("whose", WHOSE)
@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("role", ROLES)
def test_page_actions_by_role_and_launcher(world, catalog, role, action, whose):
    status, _ = ACTIONS[action]
    job = job_for(world, role=role, whose=whose, status=status)
    page = signed_in_client(getattr(world, role), world.tenant)
    url = (
        reverse(f"jobs:{action}", args=[job.pk])
        if action in ("delete", "clone")
        else reverse("jobs:action", args=[job.pk, action])
    )
    response = page.post(url)

    if whose in ALLOWED[role]:
        assert response.status_code == 302, response.content
        if action == "delete":
            assert not Job.objects.filter(pk=job.pk).exists()
        elif action == "clone":
            assert Job.objects.count() == 2
        else:
            job.refresh_from_db()
            assert job.status != status
        return
    assert response.status_code == 403
    assert expected_refusal(role, whose) in response.content.decode()
    job.refresh_from_db()
    assert job.status == status
    assert Job.objects.count() == 1


@pytest.mark.parametrize("role", ROLES)
def test_the_job_page_shows_only_the_actions_one_may_take(world, catalog, role):
    page = signed_in_client(getattr(world, role), world.tenant)
    for whose in WHOSE:
        job = job_for(world, role=role, whose=whose, status=JobStatus.RUNNING)
        html = page.get(reverse("jobs:detail", args=[job.pk])).content.decode()
        shown = {
            action
            for action in ("pause", "cancel")
            if f'action="{reverse("jobs:action", args=[job.pk, action])}"' in html
        } | ({"clone"} if f'href="{reverse("jobs:clone", args=[job.pk])}"' in html else set())
        assert shown == ({"pause", "cancel", "clone"} if whose in ALLOWED[role] else set())

        finished = job_for(world, role=role, whose=whose, status=JobStatus.FAILED)
        html = page.get(reverse("jobs:detail", args=[finished.pk])).content.decode()
        assert (reverse("jobs:delete", args=[finished.pk]) in html) == (whose in ALLOWED[role])


def test_the_auto_stop_of_someone_elses_job_is_theirs_to_set(world, catalog):
    """The idle auto-stop pauses the job: setting it is an action on the job."""
    owners = job_for(world, role="member", whose="other", status=JobStatus.RUNNING)
    mine = job_for(world, role="member", whose="own", status=JobStatus.RUNNING)
    api = token_client(world.member, world.tenant)
    settings = {"idle_auto_stop": True, "idle_minutes": 5}
    refused = api.put(f"/api/v1/jobs/{owners.pk}/monitor", settings, format="json")
    assert refused.status_code == 403, refused.content
    assert refused.json() == {"detail": OTHERS_JOB_REFUSAL, "code": "permission_denied"}
    assert api.get(f"/api/v1/jobs/{owners.pk}/monitor").status_code == 200  # reading is fine
    allowed = api.put(f"/api/v1/jobs/{mine.pk}/monitor", settings, format="json")
    assert allowed.status_code == 200, allowed.content


@pytest.mark.parametrize("role", ROLES)
def test_another_tenants_job_is_404_for_every_role_and_action(world, other_world, catalog, role):
    theirs = submit(other_world, "theirs", user=other_world.owner)
    theirs = advance_to(theirs, JobStatus.RUNNING)
    api = token_client(getattr(world, role), world.tenant)
    page = signed_in_client(getattr(world, role), world.tenant)
    url = f"/api/v1/jobs/{theirs.pk}"
    responses = [api.post(f"{url}/{action}") for action in ("pause", "resume", "cancel", "clone")]
    responses.append(api.delete(url))
    responses.append(api.put(f"{url}/monitor", {"idle_auto_stop": True}, format="json"))
    if role not in ("viewer", "finance"):  # their role refuses every action first (403)
        responses += [
            page.post(reverse("jobs:action", args=[theirs.pk, action]))
            for action in ("pause", "cancel", "clone")
        ]
        responses.append(page.post(reverse("jobs:delete", args=[theirs.pk])))
    for response in responses:
        assert response.status_code in (403, 404), response.content
        if role not in ("viewer", "finance"):
            assert response.status_code == 404, response.content
    theirs.refresh_from_db()
    assert theirs.status == JobStatus.RUNNING and Job.objects.count() == 1


# --- launch templates ----------------------------------------------------------------------


def template_of(world, user, name: str) -> LaunchTemplate:
    source = submit(world, f"{name} source", user=user)
    return services.launch_template_save(job=source, name=name, user=user)


@pytest.mark.parametrize("role", ROLES)
def test_template_delete_by_role_and_saver(world, catalog, role):
    actor = getattr(world, role)
    page = signed_in_client(actor, world.tenant)
    other = world.member if role in ("owner", "admin") else world.owner
    for whose, saver in (("own", actor), ("other", other)):
        template = template_of(world, saver, f"{whose} template")
        allowed = whose in ALLOWED[role]
        launch_page = page.get(reverse("jobs:launch"))
        delete_url = reverse("jobs:template_delete", args=[template.pk])
        if role in ("viewer", "finance"):
            assert launch_page.status_code == 403  # the launch page is for those who launch
        else:
            assert (delete_url in launch_page.content.decode()) == allowed
        response = page.post(delete_url)
        if allowed:
            assert response.status_code == 302
            assert not LaunchTemplate.objects.filter(pk=template.pk).exists()
        else:
            assert response.status_code == 403
            if role not in ("viewer", "finance"):
                assert OTHERS_TEMPLATE_REFUSAL in response.content.decode()
            assert LaunchTemplate.objects.filter(pk=template.pk).exists()


def test_a_member_cannot_replace_someone_elses_template_by_saving_over_its_name(world, catalog):
    owners = template_of(world, world.owner, "nightly")
    source = submit(world, "mine", user=world.member, command=["python", "mine.py"])
    page = signed_in_client(world.member, world.tenant)
    url = reverse("jobs:template_save", args=[source.pk])

    response = page.post(url, {"name": " nightly "})
    assert response.status_code == 403
    assert OTHERS_TEMPLATE_REFUSAL in response.content.decode()
    owners.refresh_from_db()
    assert owners.created_by == world.owner and owners.spec["command"] == ["python", "-c", "pass"]
    # Under a name of their own, or over their own template, it saves.
    assert page.post(url, {"name": "mine"}).status_code == 302
    assert page.post(url, {"name": "mine"}).status_code == 302
    assert LaunchTemplate.objects.get(name="mine").created_by == world.member


def test_the_other_tenants_template_is_404(world, other_world, catalog):
    theirs = template_of(other_world, other_world.owner, "theirs")
    page = signed_in_client(world.owner, world.tenant)
    assert page.post(reverse("jobs:template_delete", args=[theirs.pk])).status_code == 404
    assert LaunchTemplate.objects.filter(pk=theirs.pk).exists()
