"""Issue 13 §3: organisation secrets mean what they say.

A job that can use a secret can read it, so using one is checked like seeing one: a
secret is usable only in the projects it lists and, unless "members may use" is set, only
by owners' and admins' jobs. Every way in is tried: the API, the launch form, a clone of
an admin's job by a member. Values never come back out: not from the job's API or page,
its timeline, its logs, the secrets API or the audit log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings

from console.crypto import decrypt_json
from console.models import AuditEvent
from console.service_errors import ServiceError
from console.services.memberships import membership_change_role
from jobs import services
from jobs.models import Job, TenantSecret
from jobs.services.spec import MAX_ENV_TOTAL_BYTES, MAX_ENV_VALUE_BYTES, MAX_JOB_SECRETS
from tests.conftest import signed_in_client, token_client

JOBS = "/api/v1/jobs"
SECRETS = "/api/v1/secrets"
VALUE = "hf_Zq8vX2secretvalue91"


@pytest.fixture
def host(world, catalog):
    """The tests' tenant may run on the local host (a staff grant, issue 13 §1)."""
    world.tenant.may_run_on_host = True
    world.tenant.save(update_fields=["may_run_on_host"])
    return world


def make_secret(world, name="HF_TOKEN", *, projects=None, members_may_use=False, value=VALUE):
    return services.tenant_secret_set(
        tenant=world.tenant,
        user=world.owner,
        name=name,
        value=value,
        projects=projects,
        members_may_use=members_may_use,
    )


def launch(user, world, **overrides):
    body = {
        "name": "uses a secret",
        "image": "python-3.11",
        "command": ["python", "-c", "print('hi')"],
        "cpus": 1,
        "secrets": ["HF_TOKEN"],
    }
    body.update(overrides)
    return token_client(user, world.tenant).post(JOBS, body, format="json")


def injected(job_id: int) -> dict[str, str]:
    return decrypt_json(Job.objects.get(pk=job_id).secret_env_encrypted)


# --- who may use a secret -------------------------------------------------------------------


def test_member_cannot_use_a_secret_not_open_to_members(host):
    make_secret(host)

    response = launch(host.member, host)

    assert response.status_code == 400, response.content
    body = response.json()
    assert "HF_TOKEN" in body["secrets"][0] and "owners' and admins'" in body["secrets"][0]
    assert VALUE not in response.content.decode()
    assert not Job.objects.for_tenant(host.tenant).exists()


def test_member_can_use_a_secret_open_to_members(host):
    make_secret(host, members_may_use=True)

    response = launch(host.member, host)

    assert response.status_code == 201, response.content
    assert injected(response.json()["id"]) == {"HF_TOKEN": VALUE}


@pytest.mark.parametrize("role", ["owner", "admin"])
def test_owners_and_admins_can_use_a_restricted_secret(host, role):
    make_secret(host)

    response = launch(getattr(host, role), host)

    assert response.status_code == 201, response.content
    assert injected(response.json()["id"]) == {"HF_TOKEN": VALUE}


def test_a_secret_is_usable_only_in_the_projects_it_lists(host):
    make_secret(host, projects=["llm", "vision"], members_may_use=True)

    elsewhere = launch(host.member, host, project="audio")
    no_project = launch(host.admin, host)  # a role that may use it: the project still counts
    listed = launch(host.member, host, project="vision")

    assert elsewhere.status_code == 400
    assert elsewhere.json()["secrets"] == [
        "HF_TOKEN may be used only in project “llm”, “vision”; this job has project “audio”."
    ]
    assert no_project.status_code == 400
    assert "this job has no project" in no_project.json()["secrets"][0]
    assert listed.status_code == 201, listed.content
    assert injected(listed.json()["id"]) == {"HF_TOKEN": VALUE}


def test_every_refused_secret_is_named_with_its_reason(host):
    make_secret(host, "HF_TOKEN")
    make_secret(host, "WANDB_API_KEY", projects=["llm"], members_may_use=True)
    make_secret(host, "OPEN_TOKEN", members_may_use=True)

    response = launch(host.member, host, secrets=["OPEN_TOKEN", "WANDB_API_KEY", "HF_TOKEN"])

    assert response.status_code == 400
    message = response.json()["secrets"][0]
    assert "HF_TOKEN may be used only by owners' and admins' jobs." in message
    assert "WANDB_API_KEY may be used only in project “llm”" in message
    assert "OPEN_TOKEN" not in message


def test_the_launch_form_shows_the_refusal_on_the_secrets_field(host):
    make_secret(host)
    client = signed_in_client(host.member, host.tenant)

    response = client.post(
        "/jobs/launch/",
        {
            "name": "form launch",
            "image": "python-3.11",
            "command": "python -c 'print(1)'",
            "region": "local",
            "cpus": 1,
            "gpus_per_node": 0,
            "nodes": 1,
            "spot_ratio": "0",
            "priority": "normal",
            "max_runtime_minutes": 60,
            "secrets": ["HF_TOKEN"],
        },
    )

    assert response.status_code == 200  # the form again, with the error
    form = response.context["form"]
    assert form.errors["secrets"] == ["HF_TOKEN may be used only by owners' and admins' jobs."]
    assert not Job.objects.for_tenant(host.tenant).exists()


def test_a_member_cloning_a_job_that_used_an_admins_secret_is_checked_like_a_launch(host):
    make_secret(host)
    admins_job = launch(host.admin, host, project="llm").json()

    # Someone else's job: a member may not clone it at all.
    by_member = token_client(host.member, host.tenant).post(f"{JOBS}/{admins_job['id']}/clone")
    assert by_member.status_code == 403
    assert by_member.json()["code"] == "permission_denied"
    # Their own, launched while they were an admin: the clone is checked like a launch.
    membership_change_role(
        membership=host.membership(host.admin),
        role="member",
        by_membership=host.membership(host.owner),
    )
    demoted = token_client(host.admin, host.tenant).post(f"{JOBS}/{admins_job['id']}/clone")
    assert demoted.status_code == 400
    assert "HF_TOKEN may be used only by owners' and admins' jobs." in demoted.json()["secrets"]
    assert Job.objects.for_tenant(host.tenant).count() == 1
    membership_change_role(
        membership=host.membership(host.admin),
        role="admin",
        by_membership=host.membership(host.owner),
    )

    # An admin's clone gets the secret's current value, not the copy the first job had.
    make_secret(host, value="hf_rotated_value_0042")
    by_admin = token_client(host.admin, host.tenant).post(f"{JOBS}/{admins_job['id']}/clone")
    assert by_admin.status_code == 201, by_admin.content
    assert injected(by_admin.json()["id"]) == {"HF_TOKEN": "hf_rotated_value_0042"}


def test_a_clone_keeps_secret_variables_that_are_not_organisation_secrets(host):
    response = launch(host.member, host, secrets=[], secret_env={"MY_TOKEN": "mine-123456"})
    clone = token_client(host.member, host.tenant).post(f"{JOBS}/{response.json()['id']}/clone")

    assert clone.status_code == 201, clone.content
    assert injected(clone.json()["id"]) == {"MY_TOKEN": "mine-123456"}


# --- setting where a secret may be used -----------------------------------------------------


def test_secrets_api_lists_where_each_may_be_used_never_the_value(host):
    admin = token_client(host.admin, host.tenant)

    created = admin.post(
        SECRETS,
        {"name": "HF_TOKEN", "value": VALUE, "projects": ["llm", " llm "], "members_may_use": True},
        format="json",
    )
    listed = token_client(host.member, host.tenant).get(SECRETS)

    assert created.status_code == 201, created.content
    assert created.json()["projects"] == ["llm"] and created.json()["members_may_use"] is True
    assert listed.status_code == 200
    [secret] = listed.json()["results"]
    assert secret["name"] == "HF_TOKEN" and secret["projects"] == ["llm"]
    assert secret["members_may_use"] is True and secret["created_by"] == host.admin.email
    assert VALUE not in created.content.decode() + listed.content.decode()
    # Replacing it with defaults closes it to members again.
    admin.post(SECRETS, {"name": "HF_TOKEN", "value": "v2-value"}, format="json")
    secret = TenantSecret.objects.for_tenant(host.tenant).get(name="HF_TOKEN")
    assert (secret.projects, secret.members_may_use) == ([], False)


def test_only_those_who_manage_secrets_set_or_delete_them(host, other_world):
    secret = make_secret(host)
    foreign = make_secret(other_world, "GLOBEX_TOKEN")
    member = token_client(host.member, host.tenant)
    admin = token_client(host.admin, host.tenant)

    assert member.post(SECRETS, {"name": "X_TOKEN", "value": "v"}, format="json").status_code == 403
    assert member.delete(f"{SECRETS}/{secret.pk}").status_code == 403
    assert admin.delete(f"{SECRETS}/{foreign.pk}").status_code == 404
    bad = admin.post(SECRETS, {"name": "X", "value": "v", "projects": "llm"}, format="json")
    assert bad.status_code == 400 and "projects" in bad.json()
    assert admin.delete(f"{SECRETS}/{secret.pk}").status_code == 204
    assert not TenantSecret.objects.for_tenant(host.tenant).exists()
    assert TenantSecret.objects.filter(pk=foreign.pk).exists()


def test_secrets_page_sets_and_shows_projects_and_who_may_use(host):
    admin = signed_in_client(host.admin, host.tenant)

    response = admin.post(
        "/jobs/secrets/",
        {
            "name": "WANDB_API_KEY",
            "value": VALUE,
            "projects": "llm, vision",
            "members_may_use": "on",
        },
    )
    assert response.status_code == 302
    secret = TenantSecret.objects.for_tenant(host.tenant).get(name="WANDB_API_KEY")
    assert (secret.projects, secret.members_may_use) == (["llm", "vision"], True)
    make_secret(host, "HF_TOKEN")

    page = signed_in_client(host.member, host.tenant).get("/jobs/secrets/").content.decode()
    assert "llm, vision" in page and "members, admins and owners" in page
    assert "admins and owners" in page and VALUE not in page
    event = AuditEvent.objects.get(
        tenant=host.tenant, action="secret.created", metadata__name="WANDB_API_KEY"
    )
    assert event.metadata["projects"] == ["llm", "vision"]


# --- values never come back out -------------------------------------------------------------


def test_values_are_never_shown_by_the_job_api_page_timeline_logs_or_audit(host):
    make_secret(host, members_may_use=True)
    job = launch(host.member, host, secret_env={"OWN_TOKEN": "own-secret-987654"}).json()
    log = Path(settings.DATA_DIR) / "jobs" / str(job["id"]) / "output.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"token={VALUE}\nown=own-secret-987654\n")
    api = token_client(host.member, host.tenant)
    client = signed_in_client(host.member, host.tenant)

    seen = {
        "detail": api.get(f"{JOBS}/{job['id']}").content.decode(),
        "list": api.get(JOBS).content.decode(),
        "events": api.get(f"{JOBS}/{job['id']}/events").content.decode(),
        "logs": api.get(f"{JOBS}/{job['id']}/logs").content.decode(),
        "page": client.get(f"/jobs/{job['id']}/").content.decode(),
        "audit": json.dumps(list(AuditEvent.objects.values("metadata", "target_repr"))),
    }

    for where, text in seen.items():
        assert VALUE not in text, where
        assert "own-secret-987654" not in text, where
    detail = json.loads(seen["detail"])
    assert detail["secret_env"] == {"HF_TOKEN": "••••••", "OWN_TOKEN": "••••••"}
    lines = [line["text"] for line in json.loads(seen["logs"])["lines"]]
    assert lines == ["token=••••••", "own=••••••"]
    assert "HF_TOKEN=••••••" in seen["page"]


# --- organisation secrets count toward the environment's bounds (audit, issue 26) ----------


def _big_secrets(world, count: int, size: int = MAX_ENV_VALUE_BYTES) -> list[str]:
    names = [f"BIG_{n}" for n in range(count)]
    for name in names:
        make_secret(world, name, members_may_use=True, value="s" * size)
    return names


def _environment_bytes(env: dict[str, str]) -> int:
    return sum(len(k) + 1 + len(v.encode()) for k, v in env.items())


def _variables_of_bytes(total: int, prefix: str) -> dict[str, str]:
    """Variables whose NAME=value bytes add up to exactly `total`."""
    env: dict[str, str] = {}
    while total > 0:
        name = f"{prefix}{len(env)}"
        value_bytes = min(MAX_ENV_VALUE_BYTES, total - len(name) - 1)
        env[name] = "v" * value_bytes
        total -= len(name) + 1 + value_bytes
    return env


def test_eight_secrets_of_32_kib_are_refused_as_over_the_environment_bound(host):
    """The audit's case: 8 × 32 KiB of secrets gave a job 262,720 bytes of environment."""
    names = _big_secrets(host, 8)
    response = launch(host.owner, host, secrets=names)
    assert response.status_code == 400, response.content[:300]
    body = response.json()
    assert body["code"] == "invalid"
    assert f"{MAX_ENV_TOTAL_BYTES // 1024} KiB" in body["secrets"][0]
    assert "organisation secrets included" in body["secrets"][0]
    assert not Job.objects.exists()


def test_secrets_env_and_secret_env_share_the_bound_to_the_byte(host):
    (name,) = _big_secrets(host, 1)
    secret_bytes = len(name) + 1 + MAX_ENV_VALUE_BYTES
    left = MAX_ENV_TOTAL_BYTES - secret_bytes
    env = _variables_of_bytes(left // 2, "PLAIN")
    secret_env = _variables_of_bytes(left - left // 2, "MINE")
    at_limit = launch(host.owner, host, secrets=[name], env=env, secret_env=secret_env)
    assert at_limit.status_code == 201, at_limit.content[:300]
    stored = Job.objects.get()
    assert _environment_bytes(stored.env) + _environment_bytes(injected(stored.pk)) == (
        MAX_ENV_TOTAL_BYTES
    )

    over = launch(host.owner, host, secrets=[name], env=env, secret_env={**secret_env, "X": ""})
    assert over.status_code == 400
    assert "secrets" in over.json()  # the secrets pushed it over; env alone fits
    assert Job.objects.count() == 1


def test_a_spec_secret_variable_overriding_an_organisation_secret_counts_once(host):
    names = _big_secrets(host, 4)  # 4 × 32 KiB: just over the bound with the names
    assert launch(host.owner, host, secrets=names).status_code == 400
    # The spec's own BIG_0 replaces the organisation's (as the job gets it): it fits.
    response = launch(host.owner, host, secrets=names, secret_env={"BIG_0": "short"})
    assert response.status_code == 201, response.content[:300]
    assert injected(response.json()["id"])["BIG_0"] == "short"


def test_the_number_of_secrets_a_job_names_is_bounded(host):
    names = _big_secrets(host, MAX_JOB_SECRETS + 1, size=8)
    at_limit = launch(host.owner, host, secrets=names[:MAX_JOB_SECRETS])
    assert at_limit.status_code == 201, at_limit.content[:300]
    over = launch(host.owner, host, secrets=names)
    assert over.status_code == 400
    assert str(MAX_JOB_SECRETS) in over.json()["secrets"][0]
    assert Job.objects.count() == 1
    # The service refuses it without the API's serializer (the form, a clone, the SDK's
    # raw spec all end there).
    spec = services.JobSpec(
        name="direct", image="python-3.11", command=["true"], region="local", secrets=names
    )
    with pytest.raises(ServiceError) as refused:
        services.job_submit(tenant=host.tenant, user=host.owner, spec=spec)
    assert refused.value.field == "secrets"
    assert f"at most {MAX_JOB_SECRETS}" in refused.value.message
    assert Job.objects.count() == 1


def test_the_schema_documents_the_secrets_bound(host):
    schema = token_client(host.owner, host.tenant).get("/api/v1/schema/", {"format": "json"})
    secrets = schema.json()["components"]["schemas"]["JobCreateRequest"]["properties"]["secrets"]
    assert secrets["maxItems"] == MAX_JOB_SECRETS
    assert f"at most {MAX_JOB_SECRETS}" in secrets["description"]


def test_the_launch_form_shows_the_environment_bound_on_the_secrets_field(host):
    names = _big_secrets(host, 8)
    response = signed_in_client(host.owner, host.tenant).post(
        "/jobs/launch/",
        {
            "name": "form launch",
            "image": "python-3.11",
            "command": "python -c 'print(1)'",
            "region": "local",
            "cpus": 1,
            "gpus_per_node": 0,
            "nodes": 1,
            "spot_ratio": "0",
            "priority": "normal",
            "max_runtime_minutes": 60,
            "secrets": names,
        },
    )
    assert response.status_code == 200
    (error,) = response.context["form"].errors["secrets"]
    assert f"{MAX_ENV_TOTAL_BYTES // 1024} KiB" in error
    assert not Job.objects.exists()


def test_a_secret_longer_than_a_variable_may_be_is_refused_when_set(host):
    with pytest.raises(ServiceError) as refused:
        make_secret(host, "TOO_LONG", value="é" * (MAX_ENV_VALUE_BYTES // 2 + 1))  # 2 bytes each
    assert refused.value.field == "value"
    assert f"{MAX_ENV_VALUE_BYTES // 1024} KiB" in refused.value.message
    assert not TenantSecret.objects.filter(name="TOO_LONG").exists()
