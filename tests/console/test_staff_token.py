"""Staff automation tokens: a platform staff user's API token without an organisation.
It reaches the staff endpoints (tenant administration, pools, price book) and nothing
tenant-scoped; only staff may hold one, and only while they are staff."""

from __future__ import annotations

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from console.models import ApiToken, AuditEvent
from console.permissions import STAFF_TOKEN_REFUSAL
from marketplace.models import NodePool
from tests.factories import MembershipFactory, UserFactory

TOKEN_LOGIN = reverse("api-auth-token")
TOKENS = reverse("api-token-list")


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def staff(db):
    return UserFactory(email="ops@gpugeek.test", is_staff=True)


def staff_token(user, password, name="nightly-invoices") -> dict:
    response = APIClient().post(
        TOKEN_LOGIN, {"email": user.email, "password": password, "name": name}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_staff_without_organisation_gets_a_token_without_tenant(staff, password):
    body = staff_token(staff, password)

    assert body["tenant"] is None and body["token"].startswith(ApiToken.PREFIX)
    token = ApiToken.objects.get(pk=body["id"])
    assert token.tenant is None and token.user == staff and token.name == "nightly-invoices"
    event = AuditEvent.objects.get(action="api_token.created", target_id=str(token.pk))
    assert event.tenant is None and event.actor == staff
    me = bearer(body["token"]).get(reverse("api-me")).json()
    assert me["is_staff"] is True and me["tenant"] is None and me["role"] is None


def test_staff_member_gets_a_staff_token_unless_naming_an_organisation(world, password):
    user = UserFactory(is_staff=True)
    MembershipFactory(tenant=world.tenant, user=user, role="member")

    assert staff_token(user, password)["tenant"] is None
    named = APIClient().post(
        TOKEN_LOGIN,
        {"email": user.email, "password": password, "tenant": world.tenant.slug},
        format="json",
    )
    assert named.status_code == 201 and named.json()["tenant"] == world.tenant.slug


def test_non_staff_without_organisation_is_still_refused(db, password):
    loner = UserFactory()
    response = APIClient().post(
        TOKEN_LOGIN, {"email": loner.email, "password": password, "name": "x"}, format="json"
    )
    assert response.status_code == 403
    assert "any organisation" in response.json()["detail"]
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/jobs",
        "/api/v1/budgets",
        "/api/v1/members",
        "/api/v1/offers",
        "/api/v1/usage",
        "/api/v1/credits",
        "/api/v1/audit",
    ],
)
def test_staff_token_is_refused_by_tenant_scoped_endpoints(world, staff, password, url):
    api = bearer(staff_token(staff, password)["token"])
    for method in ("get", "post"):
        response = getattr(api, method)(url, {}, format="json")
        assert response.status_code == 403, (method, url, response.status_code)
        assert response.json()["detail"] == STAFF_TOKEN_REFUSAL
        assert response.json()["code"] == "staff_token"


def test_staff_token_acts_on_staff_endpoints(world, catalog, staff, password):
    api = bearer(staff_token(staff, password)["token"])

    tenants = api.get("/api/v1/staff/tenants").json()["results"]
    assert world.tenant.slug in {t["slug"] for t in tenants}
    response = api.post(
        f"/api/v1/staff/tenants/{world.tenant.slug}/suspend", {"reason": "unpaid"}, format="json"
    )
    assert response.status_code == 200 and response.json()["suspended_at"]
    assert api.post(f"/api/v1/staff/tenants/{world.tenant.slug}/reactivate").status_code == 200
    # Pools, the price book and the catalog it names.
    pool = NodePool.objects.first()
    response = api.patch(f"/api/v1/staff/pools/{pool.pk}", {"name": "Renamed"}, format="json")
    assert response.status_code == 200, response.content
    NodePool.objects.filter(pk=pool.pk).update(is_active=False)
    listed = api.get("/api/v1/staff/pools?page_size=500").json()
    assert listed["count"] == NodePool.objects.count()  # inactive ones too
    assert {row["id"] for row in listed["results"]} == set(
        NodePool.objects.values_list("pk", flat=True)
    )
    assert api.get(f"/api/v1/staff/pools/{pool.pk}").json()["name"] == "Renamed"
    assert api.get(reverse("api-price-version-list")).json()["results"]
    assert api.get(reverse("api-gpu-type-list")).json()["results"]
    assert api.get(reverse("api-region-list")).json()["results"]


def test_staff_token_stops_working_when_its_user_is_no_longer_staff(staff, password):
    api = bearer(staff_token(staff, password)["token"])
    assert api.get("/api/v1/staff/tenants").status_code == 200
    staff.is_staff = False
    staff.save(update_fields=["is_staff"])
    response = api.get("/api/v1/staff/tenants")
    assert response.status_code == 401


def test_staff_lists_creates_and_revokes_own_staff_tokens(world, staff, password):
    first = staff_token(staff, password, name="first")
    api = bearer(first["token"])
    # Someone else's staff token and a member's token are not in the list.
    other_staff = UserFactory(is_staff=True)
    staff_token(other_staff, password, name="theirs")
    MembershipFactory(tenant=world.tenant, user=staff, role="member")
    APIClient().post(
        TOKEN_LOGIN,
        {"email": staff.email, "password": password, "tenant": world.tenant.slug, "name": "org"},
        format="json",
    )

    created = api.post(TOKENS, {"name": "second"}, format="json")
    assert created.status_code == 201 and created.json()["token"].startswith(ApiToken.PREFIX)
    assert ApiToken.objects.get(name="second").tenant is None
    names = {row["name"] for row in api.get(TOKENS).json()["results"]}
    assert names == {"first", "second"}

    second = ApiToken.objects.get(name="second")
    assert api.delete(f"{TOKENS}/{second.pk}").status_code == 200
    assert bearer(created.json()["token"]).get("/api/v1/staff/tenants").status_code == 401
    theirs = ApiToken.objects.get(name="theirs")
    assert api.delete(f"{TOKENS}/{theirs.pk}").status_code == 404
    assert ApiToken.objects.get(pk=theirs.pk).revoked_at is None


def test_member_token_still_lists_only_organisation_tokens(world, staff, password):
    staff_token(staff, password)
    member_api = bearer(
        APIClient()
        .post(
            TOKEN_LOGIN,
            {"email": world.owner.email, "password": password, "name": "own"},
            format="json",
        )
        .json()["token"]
    )
    names = {row["name"] for row in member_api.get(TOKENS).json()["results"]}
    assert names == {"own"}


@pytest.mark.parametrize(
    ("selector", "accepted"),
    [
        ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "h100"}, True),
        ({"gpugeek.io/pool": ""}, True),
        (None, False),
        (["pool"], False),
        ({"pool": 7}, False),
        ({"": "x"}, False),
        ({"Bad Key": "x"}, False),
        ({"UPPER.example.com/pool": "x"}, False),
        ({"pool": "-starts-with-dash"}, False),
        ({"pool": "x" * 64}, False),
        ({f"k{n}": "v" for n in range(21)}, False),
    ],
)
def test_staff_pool_node_selector_takes_kubernetes_label_syntax(
    catalog, staff, password, selector, accepted
):
    api = bearer(staff_token(staff, password)["token"])
    pool = NodePool.objects.first()
    before = pool.node_selector
    response = api.patch(
        f"/api/v1/staff/pools/{pool.pk}", {"node_selector": selector}, format="json"
    )
    pool.refresh_from_db()
    if accepted:
        assert response.status_code == 200, response.content
        assert pool.node_selector == selector
    else:
        assert response.status_code == 400, response.content
        assert "node_selector" in response.json() and pool.node_selector == before
