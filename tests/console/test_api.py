"""The accounts and tenancy API under /api/v1/: token login, bearer auth, role checks,
the page envelope, tokens and invitations shown once, the schema and its docs pages."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import resolve, reverse
from rest_framework.test import APIClient

from console.models import ApiToken, AuditEvent, Invitation, Membership, sha256_hex
from console.permissions import Role
from console.services.tokens import api_token_create, api_token_revoke
from tests.conftest import signed_in_client, token_client
from tests.factories import AuditEventFactory, MembershipFactory, UserFactory

TOKEN_LOGIN = reverse("api-auth-token")
ME = reverse("api-me")
MEMBERS = reverse("api-member-list")
INVITATIONS = reverse("api-invitation-list")
TOKENS = reverse("api-token-list")
AUDIT = reverse("api-audit-list")


def member_url(membership: Membership) -> str:
    return reverse("api-member-detail", args=[membership.pk])


def token_url(token: ApiToken) -> str:
    return reverse("api-token-detail", args=[token.pk])


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


# --- POST /api/v1/auth/token ----


def test_token_login_returns_a_working_bearer_token(world, password):
    response = APIClient().post(
        TOKEN_LOGIN,
        {"email": world.member.email.upper(), "password": password, "name": "laptop"},
        format="json",
    )

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["tenant"] == world.tenant.slug
    assert body["name"] == "laptop"
    assert body["token"].startswith(ApiToken.PREFIX)
    token = ApiToken.objects.get(pk=body["id"])
    assert (token.user, token.tenant) == (world.member, world.tenant)
    me = bearer(body["token"]).get(ME)
    assert me.status_code == 200
    assert me.json()["email"] == world.member.email
    event = AuditEvent.objects.filter(action="api_token.created").latest("id")
    assert event.actor == world.member
    assert event.ip_address == "127.0.0.1"


def test_token_login_missing_fields_is_400_with_field_errors(db):
    response = APIClient().post(TOKEN_LOGIN, {}, format="json")

    assert response.status_code == 400
    body = response.json()
    assert "email" in body
    assert "password" in body


def test_token_login_wrong_password_is_401(world):
    response = APIClient().post(
        TOKEN_LOGIN, {"email": world.member.email, "password": "wrong-password"}, format="json"
    )

    assert response.status_code == 401
    assert response.json()["detail"] == "E-mail or password is wrong."
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("slug", ["globex", "no-such-tenant"])
def test_token_login_for_a_tenant_one_is_not_a_member_of_is_403(world, other_world, password, slug):
    response = APIClient().post(
        TOKEN_LOGIN,
        {"email": world.member.email, "password": password, "tenant": slug},
        format="json",
    )

    assert response.status_code == 403
    assert slug in response.json()["detail"]
    assert not ApiToken.objects.exists()


def test_token_login_for_a_user_without_tenant_is_403(db, password):
    loner = UserFactory()
    response = APIClient().post(
        TOKEN_LOGIN, {"email": loner.email, "password": password}, format="json"
    )

    assert response.status_code == 403
    assert "any organisation" in response.json()["detail"]


def test_token_is_bound_to_the_tenant_it_was_made_for(world, other_world, password):
    MembershipFactory(tenant=other_world.tenant, user=world.member, role=Role.VIEWER)
    # The session points at acme; the token is for globex and wins.
    client = signed_in_client(world.member, world.tenant)
    response = client.post(
        TOKEN_LOGIN,
        {"email": world.member.email, "password": password, "tenant": other_world.tenant.slug},
        content_type="application/json",
    )
    assert response.status_code == 201

    me = bearer(response.json()["token"]).get(ME).json()
    assert (me["tenant"], me["role"]) == (other_world.tenant.slug, "viewer")
    members = bearer(response.json()["token"]).get(MEMBERS).json()["results"]
    assert world.member.email in {m["email"] for m in members}
    assert world.owner.email not in {m["email"] for m in members}


def test_token_login_lockout_answers_json_429(world):
    client = APIClient()
    statuses = []
    for _ in range(6):
        response = client.post(
            TOKEN_LOGIN, {"email": world.member.email, "password": "wrong"}, format="json"
        )
        statuses.append(response.status_code)

    assert statuses[:4] == [401] * 4
    assert statuses[-1] == 429
    assert response["Content-Type"].startswith("application/json")
    assert "Too many failed sign-in attempts" in response.json()["detail"]


def test_token_login_lockout_also_refuses_the_right_password(world, password):
    """Regression: axes recorded username=None (it read the `email` credential), so a
    locked-out account still got a token with the right password."""
    client = APIClient()
    for _ in range(5):
        client.post(TOKEN_LOGIN, {"email": world.member.email, "password": "wrong"}, format="json")

    response = client.post(
        TOKEN_LOGIN, {"email": world.member.email, "password": password}, format="json"
    )

    assert response.status_code == 429
    assert not ApiToken.objects.exists()


# --- bearer authentication ----


@pytest.mark.parametrize(
    "header",
    [
        "Bearer ggt_not-a-real-token",
        "Bearer not-even-the-prefix",
        "Bearer",
        "Bearer two parts",
    ],
)
def test_bad_or_malformed_bearer_token_is_401_json(world, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get(ME)

    assert response.status_code == 401
    assert response.json()["detail"]
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_no_credentials_is_401_json(db):
    response = APIClient().get(MEMBERS)
    assert response.status_code == 401
    assert response.json()["detail"]


def test_revoked_token_is_401(world):
    token, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    client = bearer(raw)
    assert client.get(ME).status_code == 200

    api_token_revoke(token=token, by_user=world.member)

    response = client.get(ME)
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]


def test_token_of_a_removed_member_is_401(world):
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    # Deleted without the service (as the Django admin's tenant inline does): the token
    # is still active, so the authentication class itself must refuse it.
    world.membership(world.member).delete()

    response = bearer(raw).get(ME)

    assert response.status_code == 401
    assert response.json()["detail"]


def test_session_authentication_uses_the_session_tenant(world):
    client = signed_in_client(world.finance, world.tenant)

    me = client.get(ME).json()

    assert (me["email"], me["tenant"], me["role"]) == (world.finance.email, "acme", "finance")


def test_tenant_list_shows_only_own_memberships(world, other_world):
    MembershipFactory(tenant=other_world.tenant, user=world.member, role=Role.VIEWER)

    body = token_client(world.member, world.tenant).get(reverse("api-tenant-list")).json()

    assert {(t["slug"], t["role"]) for t in body["results"]} == {
        ("acme", "member"),
        ("globex", "viewer"),
    }


# --- page envelope ----


def test_lists_use_the_page_envelope_and_honour_page_size(world, owner_api):
    for n in range(4):
        api_token_create(user=world.owner, tenant=world.tenant, name=f"t{n}")

    first = owner_api.get(TOKENS, {"page_size": 2}).json()

    assert set(first) == {"count", "next", "previous", "results"}
    assert first["count"] == 5  # the fixture's token and four more
    assert len(first["results"]) == 2
    assert first["previous"] is None
    assert "page=2" in first["next"]
    last = owner_api.get(TOKENS, {"page_size": 2, "page": 3}).json()
    assert len(last["results"]) == 1
    assert last["next"] is None


def test_page_size_is_capped_at_500(world, owner_api):
    AuditEvent.objects.bulk_create(
        AuditEvent(tenant=world.tenant, actor_label="bulk", action="test.bulk") for _ in range(505)
    )

    body = owner_api.get(AUDIT, {"page_size": 10_000, "action": "test.bulk"}).json()

    assert body["count"] == 505
    assert len(body["results"]) == 500
    assert body["next"] is not None


# --- members ----


def test_admin_changes_a_role(world):
    response = token_client(world.admin, world.tenant).patch(
        member_url(world.membership(world.member)), {"role": "viewer"}, format="json"
    )

    assert response.status_code == 200, response.content
    assert response.json()["role"] == "viewer"
    assert world.membership(world.member).role == Role.VIEWER
    event = AuditEvent.objects.get(action="membership.role_changed")
    assert (event.actor, event.ip_address) == (world.admin, "127.0.0.1")


@pytest.mark.parametrize("actor", ["member", "viewer", "finance"])
def test_non_admin_cannot_change_roles(world, actor):
    response = token_client(getattr(world, actor), world.tenant).patch(
        member_url(world.membership(world.viewer)), {"role": "admin"}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["detail"]
    assert world.membership(world.viewer).role == Role.VIEWER


def test_admin_cannot_demote_an_owner_via_api(world):
    response = token_client(world.admin, world.tenant).patch(
        member_url(world.membership(world.owner)), {"role": "member"}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"


def test_last_owner_demotion_is_409(world, owner_api):
    response = owner_api.patch(
        member_url(world.membership(world.owner)), {"role": "admin"}, format="json"
    )

    assert response.status_code == 409
    assert "at least one owner" in response.json()["detail"]


def test_invalid_role_is_400_with_field_error(world, owner_api):
    response = owner_api.patch(
        member_url(world.membership(world.member)), {"role": "emperor"}, format="json"
    )

    assert response.status_code == 400
    assert "role" in response.json()


def test_patch_without_role_is_not_a_server_error(world, owner_api):
    """Regression: perform_update read validated_data["role"]; a PATCH without it was a 500."""
    owner_api.raise_request_exception = False

    response = owner_api.patch(member_url(world.membership(world.member)), {}, format="json")

    assert response.status_code in (200, 400)


def test_admin_removes_a_member_and_their_token_stops_working(world):
    _, member_raw = api_token_create(user=world.member, tenant=world.tenant, name="m")

    response = token_client(world.admin, world.tenant).delete(
        member_url(world.membership(world.member))
    )

    assert response.status_code == 204
    assert bearer(member_raw).get(ME).status_code == 401


def test_viewer_can_list_members_but_not_invite(world):
    viewer_api = token_client(world.viewer, world.tenant)

    listed = viewer_api.get(MEMBERS)
    assert listed.status_code == 200
    assert {m["email"] for m in listed.json()["results"]} == {
        world.owner.email,
        world.admin.email,
        world.member.email,
        world.viewer.email,
        world.finance.email,
    }
    invited = viewer_api.post(INVITATIONS, {"email": "x@example.test"}, format="json")
    assert invited.status_code == 403
    assert invited.json()["detail"]
    assert not Invitation.objects.exists()


# --- invitations ----


def test_invitation_accept_url_is_returned_once(world):
    admin_api = token_client(world.admin, world.tenant)

    created = admin_api.post(
        INVITATIONS, {"email": "New@Example.test", "role": "finance"}, format="json"
    )

    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["email"], body["role"], body["state"]) == (
        "new@example.test",
        "finance",
        "pending",
    )
    accept_path = re.sub(r"^https?://[^/]+", "", body["accept_url"])
    raw = resolve(accept_path).kwargs["token"]
    assert resolve(accept_path).url_name == "invitation_accept"
    assert Invitation.objects.get(pk=body["id"]).token_hash == sha256_hex(raw)
    listed = admin_api.get(INVITATIONS).json()["results"]
    assert [i["email"] for i in listed] == ["new@example.test"]
    assert "accept_url" not in listed[0]
    detail = admin_api.get(reverse("api-invitation-detail", args=[body["id"]])).json()
    assert "accept_url" not in detail
    assert raw not in str(listed) + str(detail)


def test_invitation_conflicts_are_409_with_the_field(world, owner_api):
    owner_api.post(INVITATIONS, {"email": "dup@example.test"}, format="json")

    again = owner_api.post(INVITATIONS, {"email": "dup@example.test"}, format="json")
    member = owner_api.post(INVITATIONS, {"email": world.member.email}, format="json")

    assert again.status_code == 409
    assert again.json()["email"]
    assert member.status_code == 409


def test_admin_inviting_an_owner_is_403(world):
    response = token_client(world.admin, world.tenant).post(
        INVITATIONS, {"email": "boss@example.test", "role": "owner"}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["role"]


def test_invitation_delete_revokes(world, owner_api):
    created = owner_api.post(INVITATIONS, {"email": "bye@example.test"}, format="json").json()

    response = owner_api.delete(reverse("api-invitation-detail", args=[created["id"]]))

    assert response.status_code == 200
    assert response.json()["state"] == "revoked"
    assert Invitation.objects.get(pk=created["id"]).state == "revoked"


# --- tokens ----


def test_member_sees_only_own_tokens_owner_sees_all(world):
    api_token_create(user=world.owner, tenant=world.tenant, name="owner-ci")
    member_api = token_client(world.member, world.tenant)  # creates "test" for the member
    api_token_create(user=world.member, tenant=world.tenant, name="member-ci")
    owner_api = token_client(world.owner, world.tenant)

    member_rows = member_api.get(TOKENS).json()["results"]
    owner_rows = owner_api.get(TOKENS).json()["results"]

    assert {r["owner"] for r in member_rows} == {world.member.email}
    assert {r["name"] for r in member_rows} == {"test", "member-ci"}
    assert {(r["owner"], r["name"]) for r in owner_rows} >= {
        (world.owner.email, "owner-ci"),
        (world.member.email, "member-ci"),
    }
    assert len(owner_rows) == 4  # owner-ci, member-ci and both clients' "test" tokens
    assert all("token" not in r and "key_hash" not in r for r in owner_rows)


def test_token_create_via_api_shows_the_value_once(world):
    member_api = token_client(world.member, world.tenant)

    created = member_api.post(TOKENS, {"name": "deploy"}, format="json")

    assert created.status_code == 201
    raw = created.json()["token"]
    assert bearer(raw).get(ME).status_code == 200
    detail = member_api.get(token_url(ApiToken.objects.get(name="deploy"))).json()
    assert "token" not in detail
    assert detail["prefix"] == raw[:12]


def test_token_create_without_name_is_400(world, owner_api):
    response = owner_api.post(TOKENS, {}, format="json")
    assert response.status_code == 400
    assert "name" in response.json()


def test_delete_token_revokes_and_is_idempotent(world, owner_api):
    token, raw = api_token_create(user=world.member, tenant=world.tenant, name="ci")

    first = owner_api.delete(token_url(token))
    second = owner_api.delete(token_url(token))

    assert (first.status_code, second.status_code) == (200, 200)
    assert first.json()["is_active"] is False
    assert first.json()["revoked_at"] == second.json()["revoked_at"]
    assert bearer(raw).get(ME).status_code == 401
    assert AuditEvent.objects.filter(action="api_token.revoked").count() == 1


def test_member_cannot_see_or_revoke_someone_elses_token(world):
    owner_token, owner_raw = api_token_create(
        user=world.owner, tenant=world.tenant, name="owner-only"
    )
    member_api = token_client(world.member, world.tenant)

    assert member_api.get(token_url(owner_token)).status_code == 404
    assert member_api.delete(token_url(owner_token)).status_code == 404
    assert bearer(owner_raw).get(ME).status_code == 200


# --- audit ----


def test_audit_list_for_admin_and_owner_not_member(world):
    api_token_create(user=world.member, tenant=world.tenant, name="x")

    for user in (world.owner, world.admin):
        response = token_client(user, world.tenant).get(AUDIT, {"action": "api_token."})
        assert response.status_code == 200
        actions = {e["action"] for e in response.json()["results"]}
        assert actions == {"api_token.created"}

    for user in (world.member, world.viewer, world.finance):
        response = token_client(user, world.tenant).get(AUDIT)
        assert response.status_code == 403
        assert response.json()["detail"]


def test_audit_rows_carry_actor_and_ip(world, owner_api):
    api_token_create(user=world.member, tenant=world.tenant, name="audited")

    row = owner_api.get(AUDIT, {"action": "api_token.created"}).json()["results"][0]

    assert row["actor"] == world.member.email  # newest first
    assert {"created_at", "target_type", "target_repr", "ip_address", "metadata"} <= set(row)


# --- schema and docs ----


def test_schema_is_valid_openapi(client, db):
    from drf_spectacular.validation import validate_schema

    response = client.get(reverse("api-schema"), {"format": "json"})

    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    validate_schema(schema)
    assert "/api/v1/auth/token" in schema["paths"]
    assert "bearerAuth" in schema["components"]["securitySchemes"]


@pytest.mark.parametrize("name", ["api-swagger", "api-redoc"])
def test_docs_pages_load_without_a_cdn(client, db, name):
    response = client.get(reverse(name))

    assert response.status_code == 200
    page = response.content.decode()
    assert "cdn.jsdelivr" not in page
    assert "unpkg" not in page
    assert "/static/drf_spectacular_sidecar/" in page


@pytest.mark.parametrize("name", ["api-swagger", "api-redoc"])
def test_docs_pages_load_nothing_from_third_parties(client, db, name):
    """Regression: drf-spectacular's redoc.html linked Google Fonts."""
    page = client.get(reverse(name)).content.decode()

    external = re.findall(r'(?:src|href)="(https?://[^"]+)"', page)
    assert external == []


# --- trailing slashes ----


def test_list_and_detail_routes_work_without_trailing_slash(world, owner_api):
    """Regression: SimpleRouter(trailing_slash="/?") meant "/" (DRF takes a bool), so a
    write without the slash met a 301."""
    membership = world.membership(world.member)

    listed = owner_api.get("/api/v1/members")
    patched = owner_api.patch(f"/api/v1/members/{membership.pk}", {"role": "viewer"})
    invited = owner_api.post("/api/v1/invitations", {"email": "slash@example.test"})

    assert (listed.status_code, patched.status_code, invited.status_code) == (200, 200, 201)


# --- query counts ----


def assert_constant_queries(client, url, add_rows, django_assert_max_num_queries):
    """The list costs the same number of queries with 30 more rows as with a few."""
    client.get(url)  # warm-up: the token's first use writes last_used_at
    with CaptureQueriesContext(connection) as few_rows:
        client.get(url)
    add_rows(30)
    with django_assert_max_num_queries(len(few_rows)):
        response = client.get(url)
    assert response.status_code == 200
    assert len(response.json()["results"]) >= 30
    assert len(few_rows) <= 8


def test_members_list_query_count_is_constant(world, owner_api, django_assert_max_num_queries):
    def add_members(n):
        MembershipFactory.create_batch(n, tenant=world.tenant)

    assert_constant_queries(owner_api, MEMBERS, add_members, django_assert_max_num_queries)


def test_tokens_list_query_count_is_constant(world, owner_api, django_assert_max_num_queries):
    def add_tokens(n):
        for i in range(n):
            user = MembershipFactory(tenant=world.tenant).user
            api_token_create(user=user, tenant=world.tenant, name=f"bulk-{i}")

    assert_constant_queries(owner_api, TOKENS, add_tokens, django_assert_max_num_queries)


def test_audit_list_query_count_is_constant(world, owner_api, django_assert_max_num_queries):
    def add_events(n):
        for _ in range(n):
            AuditEventFactory(tenant=world.tenant, actor=MembershipFactory().user)

    assert_constant_queries(owner_api, AUDIT, add_events, django_assert_max_num_queries)
