"""POST/GET/PATCH/DELETE /api/v1/volumes, and volumes in the job launch API."""

from __future__ import annotations

import pytest
from django.test import Client

from jobs.models import JobStatus
from tests.conftest import signed_in_client, token_client
from tests.factories import VolumeFactory
from tests.jobs_helpers import advance_to, submit

pytestmark = pytest.mark.django_db

VOLUMES = "/api/v1/volumes"


@pytest.fixture
def member_api(world):
    return token_client(world.member, world.tenant)


def test_create_get_list_grow_delete(member_api, catalog):
    created = member_api.post(
        VOLUMES,
        {"name": "data", "size_gib": 5, "region": "local", "access": "shared"},
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert {k: body[k] for k in ("name", "size_gib", "region", "access", "status")} == {
        "name": "data", "size_gib": 5, "region": "local", "access": "shared", "status": "available",
    }  # fmt: skip
    url = f"{VOLUMES}/{body['id']}"
    assert member_api.get(url).json()["name"] == "data"
    listed = member_api.get(VOLUMES).json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == body["id"]
    grown = member_api.patch(url, {"size_gib": 8}, format="json")
    assert grown.status_code == 200 and grown.json()["size_gib"] == 8
    shrunk = member_api.patch(url, {"size_gib": 2}, format="json")
    assert shrunk.status_code == 400 and shrunk.json()["code"] == "invalid"
    assert member_api.delete(url).status_code == 204
    assert member_api.get(url).status_code == 404
    assert member_api.get(VOLUMES).json()["count"] == 0


@pytest.mark.parametrize(
    "payload",
    [
        {"name": "data", "size_gib": 0, "region": "local"},
        {"name": "Data", "size_gib": 1, "region": "local"},
        {"name": "data", "size_gib": "1", "region": "local", "access": "all"},
        {"name": 5, "size_gib": 1, "region": "local"},
        {"name": "data", "size_gib": 1, "region": "atlantis"},
        {"size_gib": 1, "region": "local"},
    ],
)
def test_bad_input_is_a_400_envelope(member_api, catalog, payload):
    response = member_api.post(VOLUMES, payload, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid" and response.json()["detail"]


def test_a_reused_name_is_409(member_api, catalog):
    payload = {"name": "data", "size_gib": 1, "region": "local"}
    assert member_api.post(VOLUMES, payload, format="json").status_code == 201
    again = member_api.post(VOLUMES, payload, format="json")
    assert again.status_code == 409 and again.json()["code"] == "conflict"


def test_deleting_an_attached_volume_is_409_naming_the_job(world, member_api, catalog):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    job = submit(world, "trainer", volumes=[{"name": "data", "path": "/data"}])
    response = member_api.delete(f"{VOLUMES}/{volume.pk}")
    assert response.status_code == 409 and f"#{job.pk}" in response.json()["detail"]
    advance_to(job, JobStatus.CANCELLED)
    assert member_api.delete(f"{VOLUMES}/{volume.pk}").status_code == 204


def test_a_viewer_reads_but_does_not_change(world, catalog):
    volume = VolumeFactory(tenant=world.tenant)
    viewer = token_client(world.viewer, world.tenant)
    assert viewer.get(VOLUMES).json()["count"] == 1
    payload = {"name": "x", "size_gib": 1, "region": "local"}
    assert viewer.post(VOLUMES, payload, format="json").status_code == 403
    assert (
        viewer.patch(f"{VOLUMES}/{volume.pk}", {"size_gib": 20}, format="json").status_code == 403
    )
    assert viewer.delete(f"{VOLUMES}/{volume.pk}").status_code == 403


def test_another_tenants_volume_is_404_for_every_method(world, other_world, catalog):
    theirs = VolumeFactory(tenant=other_world.tenant, name="theirs")
    api = token_client(world.owner, world.tenant)
    url = f"{VOLUMES}/{theirs.pk}"
    assert api.get(url).status_code == 404
    assert api.patch(url, {"size_gib": 50}, format="json").status_code == 404
    assert api.delete(url).status_code == 404
    assert api.get(VOLUMES).json()["count"] == 0
    theirs.refresh_from_db()
    assert theirs.size_gib == 10 and theirs.deleted_at is None


def test_launch_api_mounts_volumes_and_refuses_a_held_one(world, member_api, catalog):
    VolumeFactory(tenant=world.tenant, name="data")
    spec = {
        "name": "reader",
        "image": "python-3.11",
        "command": ["python", "-c", "pass"],
        "volumes": [{"name": "data", "path": "/data"}],
    }
    first = member_api.post("/api/v1/jobs", spec, format="json")
    assert first.status_code == 201, first.content
    second = member_api.post("/api/v1/jobs", {**spec, "name": "second"}, format="json")
    assert second.status_code == 409, second.content
    assert f"#{first.json()['id']}" in second.json()["detail"]
    bad = member_api.post(
        "/api/v1/jobs", {**spec, "volumes": [{"name": "data", "path": "/proc/x"}]}, format="json"
    )
    assert bad.status_code == 400 and "volumes" in bad.json()


def test_the_storage_page_lists_creates_resizes_and_deletes(world, catalog):
    client = signed_in_client(world.member, world.tenant)
    empty = client.get("/storage/")
    assert empty.status_code == 200 and b"No volumes yet" in empty.content
    created = client.post(
        "/storage/", {"name": "data", "size_gib": "3", "region": "local", "access": "single_writer"}
    )
    assert created.status_code == 302
    page = client.get("/storage/")
    assert b"<code>data</code>" in page.content and b"3 GiB" in page.content
    # The demo price book: 0.10 USD per GiB-month on this host (billed by the GiB-hour).
    assert b"0.30 USD" in page.content and b"per GiB-month" in page.content
    volume = world.tenant.volumes.get()
    bad = client.post(f"/storage/{volume.pk}/resize/", {"size_gib": "1"})
    assert bad.status_code == 200 and b"only grow" in bad.content
    assert client.post(f"/storage/{volume.pk}/resize/", {"size_gib": "9"}).status_code == 302
    volume.refresh_from_db()
    assert volume.size_gib == 9
    confirm = client.get(f"/storage/{volume.pk}/delete/")
    assert confirm.status_code == 200 and b"Delete volume" in confirm.content
    assert client.post(f"/storage/{volume.pk}/delete/").status_code == 302
    volume.refresh_from_db()
    assert volume.deleted_at is not None


def test_the_storage_page_shows_a_create_error(world, catalog):
    client = signed_in_client(world.member, world.tenant)
    VolumeFactory(tenant=world.tenant, name="data")
    response = client.post(
        "/storage/", {"name": "data", "size_gib": "3", "region": "local", "access": "shared"}
    )
    assert response.status_code == 200 and b"exists already" in response.content


def test_another_tenants_volume_pages_are_404(world, other_world, catalog):
    theirs = VolumeFactory(tenant=other_world.tenant)
    client: Client = signed_in_client(world.owner, world.tenant)
    for url in (f"/storage/{theirs.pk}/resize/", f"/storage/{theirs.pk}/delete/"):
        assert client.get(url).status_code == 404
        assert client.post(url, {"size_gib": "50"}).status_code == 404
    theirs.refresh_from_db()
    assert theirs.size_gib == 10 and theirs.deleted_at is None
    assert b"No volumes yet" in client.get("/storage/").content


def test_the_nav_links_the_storage_page(world, catalog):
    client = signed_in_client(world.viewer, world.tenant)
    assert b'href="/storage/"' in client.get("/jobs/").content


def test_a_jobs_volumes_are_in_its_api_answer_and_on_its_page(world, member_api, catalog):
    VolumeFactory(tenant=world.tenant, name="data")
    VolumeFactory(tenant=world.tenant, name="models", access="shared")
    job = submit(
        world,
        "trainer",
        volumes=[
            {"name": "data", "path": "/data"},
            {"name": "models", "path": "/models", "read_only": True},
        ],
    )
    other = submit(world, "plain")
    answer = member_api.get(f"/api/v1/jobs/{job.pk}").json()
    assert answer["volumes"] == [
        {"name": "data", "path": "/data", "read_only": False, "region": "local"},
        {"name": "models", "path": "/models", "read_only": True, "region": "local"},
    ]
    listed = {row["id"]: row["volumes"] for row in member_api.get("/api/v1/jobs").json()["results"]}
    assert listed[other.pk] == [] and len(listed[job.pk]) == 2
    page = signed_in_client(world.member, world.tenant).get(f"/jobs/{job.pk}/")
    assert b'data-testid="job-volumes"' in page.content
    assert b"<code>models</code> at <code>/models</code> (read-only" in page.content
