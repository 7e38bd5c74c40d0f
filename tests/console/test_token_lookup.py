"""The organisation-token lookup compiled once per process (console.token_lookup) loads
exactly what the ORM loads, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import threading

from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.models import ApiToken, Membership, Role, sha256_hex
from console.services.tokens import api_token_create
from console.token_lookup import MODELS, organisation_token
from tests.conftest import make_world
from tests.factories import MembershipFactory


def fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def test_the_compiled_lookup_loads_every_field_as_the_orm_does(world):
    token, raw = api_token_create(user=world.admin, tenant=world.tenant, name="ci")
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=token.created_at)
    found = organisation_token(sha256_hex(raw))
    assert found is not None
    loaded, membership = found
    stored = ApiToken.objects.select_related("user", "tenant").get(pk=token.pk)
    assert fields(loaded) == fields(stored)
    assert fields(loaded.user) == fields(stored.user)
    assert fields(loaded.tenant) == fields(stored.tenant)
    assert fields(membership) == fields(world.membership(world.admin))
    assert (membership.user, membership.tenant) == (loaded.user, loaded.tenant)
    assert not loaded._state.adding and loaded._state.db == connection.alias
    assert {type(i) for i in (loaded, loaded.user, loaded.tenant, membership)} == {
        model for model, _ in MODELS
    }


def test_a_token_carries_the_membership_of_its_own_organisation(world):
    other = make_world("other")
    MembershipFactory(tenant=other.tenant, user=world.member, role=Role.ADMIN)
    _, raw = api_token_create(user=world.member, tenant=other.tenant, name="there")
    found = organisation_token(sha256_hex(raw))
    assert found is not None
    token, membership = found
    assert (token.tenant, membership.tenant, membership.role) == (
        other.tenant,
        other.tenant,
        "admin",
    )
    assert membership == Membership.objects.get(tenant=other.tenant, user=world.member)


def test_the_lookup_is_one_query_and_works_from_another_thread(world):
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="t")
    organisation_token(sha256_hex(raw))
    with CaptureQueriesContext(connection) as queries:
        assert organisation_token(sha256_hex(raw)) is not None
        assert organisation_token(sha256_hex(raw + "x")) is None
    assert len(queries) == 2
    seen = []

    def look_up_elsewhere():
        try:
            seen.append(organisation_token("0" * 64))
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=look_up_elsewhere)
    thread.start()
    thread.join()
    assert seen == [None]  # the process's compiled query, on that thread's own connection
