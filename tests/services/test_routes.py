"""What the gateway reads per request (services.selectors.gateway_route and the token
check) comes from Django's cache while nothing changes, and each change that matters to
routing counts from its commit: a revoked token, a replica that drains, a budget's pause,
a deactivated organisation, a deleted service."""

from __future__ import annotations

import pytest

from console.caching import shared_cache
from services import selectors, services
from services.models import ReplicaState, ServiceStatus
from tests.services.conftest import echo_spec

pytestmark = pytest.mark.django_db(transaction=True)  # forgets run on commit


@pytest.fixture
def routed(world, catalog):
    """A token service with two ready replicas (rows only: nothing here starts them)."""
    service = services.service_create(tenant=world.tenant, user=None, spec=echo_spec())
    _, raw = services.service_token_create(service=service, user=None, name="t")
    revision = service.current_revision
    for port in (40001, 40002):
        service.replicas.create(revision=revision, state=ReplicaState.READY, host_port=port)
    return service, raw


def lookup(raw: str):
    return selectors.gateway_access(tenant_slug="acme", name="echo", token=raw)


def test_a_known_route_and_token_cost_no_query(routed, django_assert_num_queries):
    _, raw = routed
    route, allowed = lookup(raw)
    assert allowed and [u.port for u in route.replicas] == [40001, 40002]
    with django_assert_num_queries(0):
        assert lookup(raw) == (route, True)
    with django_assert_num_queries(1):  # a wrong token is never kept
        assert lookup("ggs_wrong") == (route, False)


def test_a_known_route_and_token_are_one_read_of_the_cache(routed, monkeypatch):
    _, raw = routed
    lookup(raw)
    store = shared_cache()
    reads = []
    for method in ("get", "get_many"):
        original = getattr(store, method)
        monkeypatch.setattr(
            store, method, lambda *a, _o=original, _m=method, **k: reads.append(_m) or _o(*a, **k)
        )
    assert lookup(raw)[1] is True
    assert reads == ["get_many"]


def test_a_revoked_token_is_refused_from_the_commit_on(routed):
    service, raw = routed
    assert lookup(raw)[1]
    for token in service.tokens.all():
        services.service_token_revoke(token=token, user=None)
    assert lookup(raw)[1] is False


def test_a_draining_replica_gets_no_request_from_the_commit_on(routed):
    service, raw = routed
    assert len(lookup(raw)[0].replicas) == 2
    replica = service.replicas.get(host_port=40001)
    replica.state = ReplicaState.DRAINING
    replica.save(update_fields=["state"])
    assert [u.port for u in lookup(raw)[0].replicas] == [40002]


def test_a_budget_pause_is_seen_at_once(routed):
    service, raw = routed
    assert lookup(raw)[0].status != ServiceStatus.PAUSED
    assert services.service_budget_pause(service=service, reason="Team cap is used up")
    route = lookup(raw)[0]
    assert route.status == ServiceStatus.PAUSED and route.status_reason == "Team cap is used up"
    assert services.service_budget_resume(service=service)
    assert lookup(raw)[0].status != ServiceStatus.PAUSED


def test_a_deactivated_organisation_and_a_deleted_service_are_gone(routed, world):
    service, raw = routed
    assert lookup(raw)[0] is not None
    world.tenant.is_active = False
    world.tenant.save()
    assert lookup(raw) == (None, False)
    world.tenant.is_active = True
    world.tenant.save()
    assert lookup(raw)[0] is not None
    services.service_delete(service=service, user=None)
    assert selectors.gateway_route(tenant_slug="acme", name="echo") is None
    # The same name again is a new service, found at once.
    again = services.service_create(tenant=world.tenant, user=None, spec=echo_spec())
    assert selectors.gateway_route(tenant_slug="acme", name="echo").service_id == again.pk
