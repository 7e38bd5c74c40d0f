"""The resolved API token (console.token_lookup) is what the ORM reads, kept in Django's
cache: a kept token costs no query, a change to the token, its user, its organisation or
the membership takes effect on the next request, and without Redis the API still works."""

from __future__ import annotations

import copy

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.models import ApiToken, Membership, Role, Tenant, sha256_hex
from console.services.memberships import membership_change_role, membership_remove
from console.services.tokens import api_token_create, api_token_revoke
from console.token_lookup import resolved_token
from tests.conftest import make_world, signed_in_client
from tests.factories import MembershipFactory

JOBS = "/api/v1/jobs"


def fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def bearer(raw: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


@pytest.fixture
def no_redis(settings):
    """Django's cache pointed at a port that refuses at once (Redis down)."""
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["LOCATION"] = "redis://127.0.0.1:1/0"
    settings.CACHES = caches


def test_the_lookup_loads_every_field_as_the_orm_does(world):
    token, raw = api_token_create(user=world.admin, tenant=world.tenant, name="ci")
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=token.created_at)
    for _ in range(2):  # read, then kept
        found = resolved_token(sha256_hex(raw))
        assert found is not None
        loaded, membership = found
        stored = ApiToken.objects.select_related("user", "tenant").get(pk=token.pk)
        assert fields(loaded) == fields(stored)
        assert fields(loaded.user) == fields(stored.user)
        assert fields(loaded.tenant) == fields(stored.tenant)
        assert membership is not None
        assert fields(membership) == fields(world.membership(world.admin))
        assert (membership.user, membership.tenant) == (loaded.user, loaded.tenant)


def test_a_token_carries_the_membership_of_its_own_organisation(world):
    other = make_world("other")
    MembershipFactory(tenant=other.tenant, user=world.member, role=Role.ADMIN)
    _, raw = api_token_create(user=world.member, tenant=other.tenant, name="there")
    found = resolved_token(sha256_hex(raw))
    assert found is not None
    token, membership = found
    assert membership is not None
    assert (token.tenant, membership.tenant, membership.role) == (
        other.tenant,
        other.tenant,
        "admin",
    )
    assert membership == Membership.objects.get(tenant=other.tenant, user=world.member)


def test_a_kept_token_costs_no_query_and_an_unknown_one_is_not_kept(world):
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    assert resolved_token(sha256_hex(raw)) is not None
    with CaptureQueriesContext(connection) as queries:
        assert resolved_token(sha256_hex(raw)) is not None
    assert len(queries) == 0
    with CaptureQueriesContext(connection) as queries:
        assert resolved_token(sha256_hex(raw + "x")) is None
        assert resolved_token(sha256_hex(raw + "x")) is None
    assert len(queries) == 2  # nothing found is looked for again


def test_an_api_request_with_a_kept_token_reads_no_token_row(world, client):
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    assert client.get(JOBS, **bearer(raw)).status_code == 200  # reads it, marks its use
    assert client.get(JOBS, **bearer(raw)).status_code == 200  # reads it again, keeps it
    with CaptureQueriesContext(connection) as queries:
        assert client.get(JOBS, **bearer(raw)).status_code == 200
    assert not [q for q in queries if "console_apitoken" in q["sql"]]


def test_a_revoked_token_is_refused_on_the_next_request(world, client):
    token, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    for _ in range(3):  # kept by now
        assert client.get(JOBS, **bearer(raw)).status_code == 200
    api_token_revoke(token=token, by_user=world.owner)
    assert client.get(JOBS, **bearer(raw)).status_code == 401


def test_a_removed_member_s_token_and_session_stop_at_once(world, client):
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    page = signed_in_client(world.member, world.tenant)
    for _ in range(3):
        assert client.get(JOBS, **bearer(raw)).status_code == 200
        assert page.get("/jobs/").status_code == 200
    membership_remove(
        membership=world.membership(world.member), by_membership=world.membership(world.owner)
    )
    assert client.get(JOBS, **bearer(raw)).status_code == 401
    assert page.get("/jobs/").status_code in (302, 403, 404)


def test_a_new_role_applies_to_a_kept_token_at_once(world, client):
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    for _ in range(3):
        assert client.get(JOBS, **bearer(raw)).status_code == 200
    membership_change_role(
        membership=world.membership(world.member),
        role=Role.VIEWER,
        by_membership=world.membership(world.owner),
    )
    found = resolved_token(sha256_hex(raw))
    assert found is not None and found[1] is not None and found[1].role == Role.VIEWER


def test_a_deactivated_organisation_s_token_is_refused(world, client):
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    for _ in range(3):
        assert client.get(JOBS, **bearer(raw)).status_code == 200
    tenant = Tenant.objects.get(pk=world.tenant.pk)
    tenant.is_active = False
    tenant.save()
    assert client.get(JOBS, **bearer(raw)).status_code == 401


def test_without_redis_the_api_and_signed_in_pages_read_the_database(world, client, no_redis):
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    for _ in range(2):
        assert client.get(JOBS, **bearer(raw)).status_code == 200
    page = signed_in_client(world.member, world.tenant)
    assert page.get("/jobs/").status_code == 200
    assert client.get(JOBS, **bearer(raw + "x")).status_code == 401
