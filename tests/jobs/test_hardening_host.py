"""Issue 13: "This host" is a privilege staff grant, spec sizes are bounded, and priority
`critical` is for owners and admins.

Each test performs the trigger (a stranger's launch on the host, an oversized spec, a
member's critical launch) through the real API, form or service and shows it refused."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console import host_access
from console.models import AuditEvent, Tenant
from console.permissions import Role
from console.service_errors import ServiceError
from console.services.tenants import tenant_create
from jobs.models import Job, JobStatus
from jobs.services import JobSpec, job_submit
from jobs.services.spec import (
    MAX_COMMAND_ARG_BYTES,
    MAX_COMMAND_ARGS,
    MAX_ENV_NAME_LENGTH,
    MAX_ENV_TOTAL_BYTES,
    MAX_ENV_VALUE_BYTES,
    MAX_ENV_VARS,
    MAX_LABELS,
)
from marketplace.models import NodePool
from tests.conftest import SimulatedLocalHost, signed_in_client, token_client
from tests.factories import MembershipFactory, UserFactory

JOBS = "/api/v1/jobs"
ESTIMATES = "/api/v1/estimates"
OFFERS_API = "/api/v1/offers"
POOLS_API = "/api/v1/pools"
STAFF_TENANTS_API = "/api/v1/staff/tenants"
LAUNCH = reverse("jobs:launch")
HOST_REFUSED = "This host is not available to this organisation."


def body(**overrides) -> dict:
    values = {
        "name": "job",
        "image": "python-3.11",
        "command": ["python", "-c", "print('hi')"],
        "cpus": 1,
        "region": "local",
    }
    values.update(overrides)
    return values


def form_data(**overrides) -> dict:
    data = {
        "name": "form job",
        "gpu_type": "",
        "gpus_per_node": "0",
        "cpus": "1",
        "nodes": "1",
        "region": "local",
        "spot_ratio": "0",
        "image": "python-3.11",
        "command": "python -c 'print(42)'",
        "priority": "normal",
        "max_runtime_minutes": "60",
        "auto_release": "on",
    }
    data.update(overrides)
    return data


@pytest.fixture
def stranger(db, catalog, settings):
    """A new sign-up: its owner created the organisation (as sign-up does); staff have
    not allowed it on this host."""
    settings.COMPUTE_BACKENDS = ["local", "kubernetes"]
    owner = UserFactory(email="owner@stranger.test")
    tenant = tenant_create(name="Stranger Ltd", owner=owner)
    assert tenant.may_run_on_host is False
    return tenant, owner


@pytest.fixture
def staff(db):
    return UserFactory(email="staff@platform.test", is_staff=True)


# --- the host is a privilege ----


def test_capacity_sync_marks_the_host_pools(catalog):
    local = NodePool.objects.filter(backend="local")
    assert local.exists() and all(pool.on_console_host for pool in local)
    assert not NodePool.objects.exclude(backend="local").filter(on_console_host=True).exists()


def test_a_new_tenant_cannot_launch_on_the_host(stranger):
    tenant, owner = stranger
    response = token_client(owner, tenant).post(JOBS, body(), format="json")
    assert response.status_code == 400, response.content
    assert response.json()["region"] == [HOST_REFUSED]
    assert not Job.objects.exists()


def test_a_new_tenant_is_not_placed_on_the_host_by_default(stranger, settings):
    tenant, owner = stranger
    settings.COMPUTE_BACKENDS = ["local"]  # the host is the only backend
    response = token_client(owner, tenant).post(JOBS, body(region=None), format="json")
    assert response.status_code == 400
    assert "region" in response.json()
    assert not Job.objects.exists()


def test_a_new_tenant_sees_no_host_offer_or_pool(stranger):
    tenant, owner = stranger
    page = signed_in_client(owner, tenant).get(reverse("marketplace:offers"))
    assert page.status_code == 200
    assert "This host" not in page.content.decode()
    api = token_client(owner, tenant)
    offers = api.get(OFFERS_API, {"page_size": 500}).json()
    rows = offers["results"] if isinstance(offers, dict) else offers
    assert rows and all(row["region"] != "local" for row in _regions(rows))
    pools = api.get(POOLS_API).json()
    pools = pools["results"] if isinstance(pools, dict) else pools
    # (Not a substring of the whole row: `locality_weight` is a pool's knob everywhere.)
    assert pools and not any("local" in (pool["region"], pool["backend"]) for pool in pools)


REGIONS_API = "/api/v1/regions"


def test_a_new_tenant_is_not_listed_the_host_region_and_cannot_read_it(stranger):
    tenant, owner = stranger
    api = token_client(owner, tenant)
    listed = api.get(REGIONS_API, {"page_size": 500})
    assert listed.status_code == 200
    slugs = {row["slug"] for row in listed.json()["results"]}
    assert "local" not in slugs and {"us-west", "us-east", "eu-central"} <= slugs
    assert "This host" not in listed.content.decode()
    hidden = api.get(f"{REGIONS_API}/local")
    assert hidden.status_code == 404
    assert hidden.json()["code"] == "not_found"
    assert api.get(f"{REGIONS_API}/us-west").status_code == 200


def test_an_allowed_tenant_is_listed_the_host_region(world, catalog, staff):
    api = token_client(world.member, world.tenant)
    slugs = {row["slug"] for row in api.get(REGIONS_API, {"page_size": 500}).json()["results"]}
    assert "local" in slugs
    assert api.get(f"{REGIONS_API}/local").json()["name"] == "This host"
    # Revoked: gone from the next read, as from the launch form.
    host_access.tenant_set_may_run_on_host(tenant=world.tenant, allowed=False, user=staff)
    slugs = {row["slug"] for row in api.get(REGIONS_API, {"page_size": 500}).json()["results"]}
    assert "local" not in slugs
    assert api.get(f"{REGIONS_API}/local").status_code == 404


def _regions(rows: list[dict]) -> list[dict]:
    """Each offer's region as a dict with a slug under "region" (the API nests it)."""
    return [
        {"region": row["region"]["slug"] if isinstance(row["region"], dict) else row["region"]}
        for row in rows
    ]


def test_a_new_tenant_is_not_offered_the_host_in_the_launch_form(stranger):
    tenant, owner = stranger
    client = signed_in_client(owner, tenant)
    page = client.get(LAUNCH)
    assert "This host" not in page.content.decode()
    form = page.context["form"]
    slugs = [region.slug for region in form.fields["region"].queryset]
    assert "local" not in slugs and slugs
    assert form.initial["region"] != "local"
    response = client.post(LAUNCH, form_data())
    assert response.status_code == 200
    assert response.context["form"].errors["region"]
    assert not Job.objects.exists()


def test_a_new_tenant_gets_no_estimate_for_the_host(stranger):
    tenant, owner = stranger
    api = token_client(owner, tenant)
    request = {"region": "local", "nodes": 1, "cpus": 1, "hours": "1"}
    response = api.post(ESTIMATES, request, format="json")
    assert response.status_code == 400
    assert response.json()["region"] == [HOST_REFUSED]
    elsewhere = api.post(ESTIMATES, {**request, "region": "us-west"}, format="json")
    assert elsewhere.status_code == 200, elsewhere.content

    live = signed_in_client(owner, tenant).get(
        reverse("marketplace:estimate"),
        {"region": "local", "nodes": 1, "cpus": 1, "hours": 1, "tier": "on_demand"},
    )
    assert live.context["estimate"] is None
    assert live.context["estimate_form"].errors["region"]


def test_an_allowed_tenant_still_launches_on_the_host(world, catalog):
    response = token_client(world.member, world.tenant).post(JOBS, body(), format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get().pool.on_console_host


def test_staff_allow_and_revoke_on_the_staff_page_audited(stranger, staff):
    tenant, owner = stranger
    page = signed_in_client(staff)
    url = reverse("staff_tenant_detail", args=[tenant.slug])
    assert "Allow on this host" in page.get(url).content.decode()

    assert page.post(url, {"may_run_on_host": "on"}).status_code == 302
    tenant.refresh_from_db()
    assert tenant.may_run_on_host
    response = token_client(owner, tenant).post(JOBS, body(), format="json")
    assert response.status_code == 201, response.content

    page.post(url, {"may_run_on_host": "off"})
    tenant.refresh_from_db()
    assert not tenant.may_run_on_host
    actions = list(
        AuditEvent.objects.filter(target_type="tenant", target_id=str(tenant.pk))
        .exclude(action="tenant.created")
        .values_list("action", "actor__email")
    )
    assert actions.count(("tenant.host_allowed", "staff@platform.test")) == 1
    assert actions.count(("tenant.host_revoked", "staff@platform.test")) == 1


def test_the_staff_page_is_not_a_tenant_owners(stranger):
    tenant, owner = stranger
    url = reverse("staff_tenant_detail", args=[tenant.slug])
    assert signed_in_client(owner, tenant).post(url, {"may_run_on_host": "on"}).status_code == 404
    tenant.refresh_from_db()
    assert not tenant.may_run_on_host


def test_staff_api_toggles_the_host_audited(stranger, staff):
    tenant, owner = stranger
    # Staff need a token; the token's tenant is any they belong to.
    MembershipFactory(tenant=tenant, user=staff, role=Role.VIEWER)
    api = token_client(staff, tenant)
    url = f"{STAFF_TENANTS_API}/{tenant.slug}"
    assert api.get(url).json()["may_run_on_host"] is False
    response = api.patch(url, {"may_run_on_host": True}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["may_run_on_host"] is True
    assert Tenant.objects.get(pk=tenant.pk).may_run_on_host
    assert AuditEvent.objects.filter(action="tenant.host_allowed", actor=staff).count() == 1

    # The owner of the tenant is no staff: not found (the staff area is not advertised),
    # nothing changes.
    owner_api = token_client(owner, tenant)
    assert owner_api.patch(url, {"may_run_on_host": False}, format="json").status_code == 404
    assert owner_api.get(STAFF_TENANTS_API).status_code == 404
    assert Tenant.objects.get(pk=tenant.pk).may_run_on_host


def test_a_revoked_tenant_loses_the_host_at_the_next_launch(world, catalog, staff):
    host_access.tenant_set_may_run_on_host(tenant=world.tenant, allowed=False, user=staff)
    response = token_client(world.owner, world.tenant).post(JOBS, body(), format="json")
    assert response.status_code == 400
    assert response.json()["region"] == [HOST_REFUSED]


def test_a_region_with_other_pools_stays_but_its_host_pools_do_not(stranger):
    tenant, owner = stranger
    NodePool.objects.filter(slug="demo-us-west-cpu-on-demand").update(on_console_host=True)
    NodePool.objects.filter(backend="local").update(is_active=False)
    # us-west still has cluster pools, so it is offered; its host CPU pool is not used.
    response = token_client(owner, tenant).post(
        JOBS, body(region="us-west", image="python-3.11"), format="json"
    )
    assert response.status_code == 400
    assert "No on-demand CPU pool in us-west" in response.json()["region"][0]


def test_the_simulated_host_is_on_the_console_host():
    assert SimulatedLocalHost.runs_on_console_host is True


# --- spec sizes ----


def _launch(api, **overrides):
    return api.post(JOBS, body(**overrides), format="json")


def _env_of_bytes(total: int, prefix: str = "V") -> dict[str, str]:
    """Variables whose NAME=value bytes add up to exactly `total`."""
    env, index = {}, 0
    while total > 0:
        name = f"{prefix}{index}"
        overhead = len(name) + 1
        value_bytes = min(MAX_ENV_VALUE_BYTES, total - overhead)
        env[name] = "x" * value_bytes
        total -= overhead + value_bytes
        index += 1
    return env


@pytest.fixture
def owner_api_local(world, catalog):
    return token_client(world.owner, world.tenant)


@pytest.mark.parametrize(
    ("field", "at_limit", "over_limit"),
    [
        ("command", ["echo"] * MAX_COMMAND_ARGS, ["echo"] * (MAX_COMMAND_ARGS + 1)),
        (
            "command",
            ["echo", "x" * MAX_COMMAND_ARG_BYTES],
            ["echo", "x" * (MAX_COMMAND_ARG_BYTES + 1)],
        ),
        (
            "env",
            {f"V{i}": "1" for i in range(MAX_ENV_VARS)},
            {f"V{i}": "1" for i in range(MAX_ENV_VARS + 1)},
        ),
        ("env", {"BIG": "x" * MAX_ENV_VALUE_BYTES}, {"BIG": "x" * (MAX_ENV_VALUE_BYTES + 1)}),
        (
            "env",
            {"N" * MAX_ENV_NAME_LENGTH: "1"},
            {"N" * (MAX_ENV_NAME_LENGTH + 1): "1"},
        ),
        ("env", _env_of_bytes(MAX_ENV_TOTAL_BYTES), _env_of_bytes(MAX_ENV_TOTAL_BYTES + 1)),
        (
            "labels",
            {f"k{i}": "v" for i in range(MAX_LABELS)},
            {f"k{i}": "v" for i in range(MAX_LABELS + 1)},
        ),
        ("labels", {"a" * 63: "b" * 63}, {"a" * 64: "b"}),
        ("labels", {"team": "b" * 63}, {"team": "b" * 64}),
        ("labels", {"example.com/team": ""}, {"example.com/-team": "x"}),
        ("labels", {"app.kubernetes.io/name": "my.app_1"}, {"team": "-bad"}),
        ("labels", {"team": "ml"}, {"Example.com/team": "ml"}),
    ],
)
def test_spec_bounds_at_the_limit_pass_and_over_it_are_400(
    owner_api_local, field, at_limit, over_limit
):
    ok = _launch(owner_api_local, **{field: at_limit})
    assert ok.status_code == 201, ok.content[:300]
    refused = _launch(owner_api_local, **{field: over_limit})
    assert refused.status_code == 400, refused.content[:300]
    assert field in refused.json(), refused.content[:300]
    assert Job.objects.count() == 1


def test_env_and_secret_env_share_one_size_limit(owner_api_local):
    half = MAX_ENV_TOTAL_BYTES // 2
    ok = _launch(owner_api_local, env=_env_of_bytes(half, "P"), secret_env=_env_of_bytes(half, "S"))
    assert ok.status_code == 201, ok.content[:300]
    refused = _launch(
        owner_api_local, env=_env_of_bytes(half, "P"), secret_env=_env_of_bytes(half + 1, "S")
    )
    assert refused.status_code == 400
    assert "128 KiB" in refused.json()["secret_env"][0]
    too_many = _launch(
        owner_api_local,
        env={f"P{i}": "1" for i in range(MAX_ENV_VARS // 2)},
        secret_env={f"S{i}": "1" for i in range(MAX_ENV_VARS // 2 + 1)},
    )
    assert too_many.status_code == 400
    assert str(MAX_ENV_VARS) in too_many.json()["secret_env"][0]


def test_the_limit_is_named_in_the_message(owner_api_local):
    cases = {
        "command": (["echo"] * (MAX_COMMAND_ARGS + 1), "256"),
        "env": ({f"V{i}": "1" for i in range(MAX_ENV_VARS + 1)}, "128"),
        "labels": ({f"k{i}": "v" for i in range(MAX_LABELS + 1)}, "32"),
    }
    for field, (value, limit) in cases.items():
        response = _launch(owner_api_local, **{field: value})
        assert limit in " ".join(response.json()[field]), response.content[:300]


def test_the_service_enforces_the_bounds_without_the_api(world, catalog):
    """The form and the API mirror some limits; `spec_validate` is what decides."""
    spec = JobSpec(
        name="direct",
        image="python-3.11",
        command=["echo"] * (MAX_COMMAND_ARGS + 1),
        region="local",
    )
    with pytest.raises(ServiceError) as refused:
        job_submit(tenant=world.tenant, user=world.owner, spec=spec)
    assert refused.value.field == "command"
    spec.command = ["echo"]
    spec.env = {"BIG": "x" * (MAX_ENV_VALUE_BYTES + 1)}
    with pytest.raises(ServiceError) as refused:
        job_submit(tenant=world.tenant, user=world.owner, spec=spec)
    assert refused.value.field == "env" and "32 KiB" in refused.value.message


# --- priority critical ----


def test_a_member_cannot_launch_critical(world, catalog):
    response = token_client(world.member, world.tenant).post(
        JOBS, body(priority="critical"), format="json"
    )
    assert response.status_code == 403, response.content
    assert "owners and admins" in response.json()["detail"]
    assert not Job.objects.exists()


def test_a_member_gets_a_form_error_for_critical(world, catalog, settings):
    settings.COMPUTE_BACKENDS = ["local"]
    client = signed_in_client(world.member, world.tenant)
    response = client.post(LAUNCH, form_data(priority="critical"))
    assert response.status_code == 200
    assert "owners and admins" in " ".join(response.context["form"].errors["priority"])
    assert not Job.objects.exists()


def test_a_member_cannot_clone_a_critical_job_into_critical(world, catalog):
    job_id = token_client(world.admin, world.tenant).post(
        JOBS, body(priority="critical"), format="json"
    )
    assert job_id.status_code == 201
    clone = token_client(world.member, world.tenant).post(f"{JOBS}/{job_id.json()['id']}/clone")
    assert clone.status_code == 403
    assert Job.objects.count() == 1


@pytest.mark.parametrize("role", ["admin", "owner"])
def test_admins_and_owners_launch_critical(world, catalog, role):
    user = getattr(world, role)
    response = token_client(user, world.tenant).post(JOBS, body(priority="critical"), format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert job.priority == "critical" and job.status != JobStatus.FAILED
