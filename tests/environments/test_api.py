"""The environments API: create, list, read, change, start, stop and delete, the clear
refusals (400 with the field, 409, 403) and the tenant scope (another organisation's
environment is a 404). The jobs it starts are real launches (job_submit, admission);
their processes are tested in test_ssh.py."""

from __future__ import annotations

import pytest

from console.services.ssh_keys import ssh_key_add
from environments import sshd
from environments.models import Environment, EnvironmentStatus
from jobs.models import Job
from marketplace.models import Image, ImageInteractive
from storage.models import Volume
from tests.conftest import token_client
from tests.factories import MembershipFactory, UserFactory, ed25519_public_key_line
from tests.jobs_helpers import advance_to, submit

API = "/api/v1/environments"
SPEC = {"name": "box", "region": "local", "image": "python-3.11", "cpus": 1}


@pytest.fixture
def member_api(world):
    return token_client(world.member, world.tenant)


@pytest.fixture
def created(world, catalog, member_api):
    response = member_api.post(API, SPEC, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def with_key(user):
    ssh_key_add(user=user, public_key=ed25519_public_key_line())


def test_create_makes_a_stopped_environment_with_its_home_volume(created, world):
    assert created["status"] == "stopped"
    assert created["home_volume"] == "box-home"
    assert created["region"] == "local" and created["cpus"] == 1
    assert created["idle_policy"]["idle_minutes"] == 60
    assert created["ssh_command"].startswith("ssh -J box.acme@")
    assert created["ssh_command"].endswith(f" {sshd.SSH_USER}@box.acme")
    assert "ProxyJump box.acme@" in created["ssh_config"]
    assert created["ssh_known_hosts"].startswith("box.acme ssh-ed25519 ")
    assert created["ssh_host_key_fingerprint"].startswith("SHA256:")
    volume = Volume.objects.for_tenant(world.tenant).get(name="box-home")
    assert volume.size_gib == 10 and volume.deleted_at is None


def test_jupyter_environments_answer_their_url_and_start_without_a_key(world, catalog, member_api):
    assert member_api.post(API, SPEC, format="json").json()["jupyter_url"] == ""
    response = member_api.post(
        API, {**SPEC, "name": "lab", "interactive": "jupyter"}, format="json"
    )
    assert response.status_code == 201, response.content
    lab = response.json()
    assert lab["jupyter_url"] == "http://testserver/env/acme/lab/tree"
    assert lab["ssh_command"] == ""
    # Nobody needs an SSH key for Jupyter alone.
    started = member_api.post(f"{API}/lab/start", format="json")
    assert started.status_code == 200, started.content
    job = Job.objects.get(pk=started.json()["current_job"])
    assert [p["name"] for p in job.ports] == ["jupyter"]
    assert "/env/acme/lab/" in " ".join(job.command)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Not A Label"}, "name"),
        ({"region": "nowhere"}, "region"),
        ({"image": "no-such-image"}, "image"),
        ({"interactive": "vnc"}, "interactive"),
        ({"idle_policy": {"idle_minutes": 1}}, "idle_policy"),
        ({"idle_policy": {"sometime": 5}}, "idle_policy"),
        ({"home_volume": "missing"}, "home_volume"),
        ({"volumes": [{"name": "x", "path": "/workspace"}]}, "volumes"),
        ({"env": {"SSHD_HOST_KEY": "mine"}}, "env"),
        ({"env": {"ENVIRONMENT_JUPYTER_TOKEN": "mine"}}, "env"),
        ({"secrets": ["NOT_THERE"]}, "secrets"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(world, catalog, member_api, change, field):
    response = member_api.post(API, {**SPEC, **change}, format="json")
    assert response.status_code == 400, response.content
    assert field in str(response.json())
    assert not Environment.objects.exists()
    assert not Volume.objects.filter(name="box-home").exists()  # nothing half-made


def test_a_name_reused_is_a_409(created, member_api):
    response = member_api.post(API, SPEC, format="json")
    assert response.status_code == 409
    assert "exists already" in response.json()["detail"]


def test_a_named_home_volume_is_used(world, catalog, member_api):
    member_api.post("/api/v1/volumes", {"name": "mine", "size_gib": 5, "region": "local"},
                    format="json")  # fmt: skip
    response = member_api.post(API, {**SPEC, "home_volume": "mine"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["home_volume"] == "mine"


def test_list_and_detail_are_the_tenant_s_own(created, world, other_world, catalog):
    mine = token_client(world.viewer, world.tenant).get(API).json()
    assert [row["name"] for row in mine["results"]] == ["box"]
    theirs = token_client(other_world.owner, other_world.tenant)
    assert theirs.get(API).json()["results"] == []
    for method, path in [
        ("get", f"{API}/box"),
        ("post", f"{API}/box/start"),
        ("post", f"{API}/box/stop"),
        ("patch", f"{API}/box"),
        ("delete", f"{API}/box?keep_volume=true"),
    ]:
        response = getattr(theirs, method)(path, {}, format="json")
        assert response.status_code == 404, (method, path, response.content)
    assert Environment.objects.filter(name="box", tenant=world.tenant).exists()


def test_start_runs_it_as_a_job_and_stop_cancels_it(created, world, member_api):
    refused = member_api.post(f"{API}/box/start")
    assert refused.status_code == 400
    assert "SSH public key" in refused.json()["detail"]

    with_key(world.member)
    started = member_api.post(f"{API}/box/start")
    assert started.status_code == 200, started.content
    assert started.json()["status"] == "starting"
    job = Job.objects.get(pk=started.json()["current_job"])
    assert job.command[:2] == ["/bin/sh", "-c"] and "/usr/sbin/sshd -D -e" in job.command[2]
    assert "PasswordAuthentication no" in job.command[5]
    assert job.ports == [{"name": "ssh", "port": sshd.SSHD_PORT}]
    assert job.secret_env_names == [sshd.HOST_KEY_VARIABLE]  # the host key, encrypted
    assert member_api.post(f"{API}/box/start").status_code == 409

    stopped = member_api.post(f"{API}/box/stop")
    assert stopped.status_code == 200, stopped.content
    assert stopped.json()["status"] == "stopped"  # its job never ran: cancelled at once
    again = member_api.post(f"{API}/box/stop")
    assert again.status_code == 409
    assert "stopped already" in again.json()["detail"]


def test_start_is_a_409_while_a_job_holds_the_home_volume(created, world, member_api):
    with_key(world.member)
    holder = submit(world, "writer", volumes=[{"name": "box-home", "path": "/data"}])
    assert not holder.is_finished
    response = member_api.post(f"{API}/box/start")
    assert response.status_code == 409
    assert f"#{holder.pk}" in response.json()["detail"]
    assert Environment.objects.get(name="box").current_job is None


def test_delete_asks_about_the_volume_and_refuses_a_running_one(created, world, member_api):
    with_key(world.member)
    member_api.post(f"{API}/box/start")
    assert member_api.delete(f"{API}/box?keep_volume=true").status_code == 409
    member_api.post(f"{API}/box/stop")
    assert member_api.delete(f"{API}/box").status_code == 400  # keep_volume is asked
    assert member_api.delete(f"{API}/box?keep_volume=true").status_code == 204
    assert Volume.objects.get(name="box-home").deleted_at is None

    member_api.post(API, {**SPEC, "name": "other"}, format="json")
    assert member_api.delete(f"{API}/other?keep_volume=false").status_code == 204
    assert Volume.objects.get(name="other-home").deleted_at is not None
    assert not Environment.objects.exists()


def test_patch_changes_the_spec_for_the_next_start(created, world, member_api):
    response = member_api.patch(f"{API}/box", {"cpus": 2, "idle_policy": {"idle_minutes": 30}},
                                format="json")  # fmt: skip
    assert response.status_code == 200, response.content
    assert response.json()["cpus"] == 2
    assert response.json()["idle_policy"]["idle_minutes"] == 30
    bad = member_api.patch(f"{API}/box", {"image": "no-such-image"}, format="json")
    assert bad.status_code == 400 and "image" in str(bad.json())
    assert Environment.objects.get(name="box").image == "python-3.11"


def test_members_use_their_own_owners_and_admins_any_viewers_none(created, world, catalog):
    other_member = UserFactory(email="second@acme.test")
    MembershipFactory(tenant=world.tenant, user=other_member, role="member")
    response = token_client(other_member, world.tenant).post(f"{API}/box/start")
    assert response.status_code == 403
    viewer = token_client(world.viewer, world.tenant)
    assert viewer.post(API, {**SPEC, "name": "mine"}, format="json").status_code == 403
    with_key(world.admin)
    assert token_client(world.admin, world.tenant).post(f"{API}/box/start").status_code == 200


def test_status_follows_the_job(created, world, member_api):
    with_key(world.member)
    member_api.post(f"{API}/box/start")
    environment = Environment.objects.get(name="box")
    job = environment.current_job
    advance_to(job, "running")
    assert member_api.get(f"{API}/box").json()["status"] == EnvironmentStatus.RUNNING
    advance_to(job, "failed", reason="exit code 1: sshd: no hostkeys available")
    body = member_api.get(f"{API}/box").json()
    assert body["status"] == "failed" and "hostkeys" in body["status_reason"]


def test_on_a_cluster_the_image_must_serve_what_the_environment_offers(
    world, catalog, member_api, settings
):
    settings.COMPUTE_BACKENDS = ["local", "kubernetes"]  # us-west: Kubernetes pools only
    plain = {**SPEC, "region": "us-west", "image": "python-3.11"}
    response = member_api.post(API, plain, format="json")
    assert response.status_code == 400, response.content
    assert "image" in response.json() and "serves sshd itself" in str(response.json())
    Image.objects.filter(slug="python-3.11").update(interactive=ImageInteractive.JUPYTER)
    response = member_api.post(API, plain, format="json")  # Jupyter only: no sshd
    assert response.status_code == 400 and "serves sshd itself" in str(response.json())
    response = member_api.post(API, {**plain, "interactive": "jupyter"}, format="json")
    assert response.status_code == 201, response.content
    assert not Environment.objects.filter(name="box", region__slug="local").exists()
    # On the console's host the console provides both, whatever the image.
    Image.objects.filter(slug="python-3.11").update(interactive=ImageInteractive.NONE)
    response = member_api.post(API, {**SPEC, "name": "here"}, format="json")
    assert response.status_code == 201, response.content
    assert Volume.objects.filter(name="here-home").exists()
