"""services.services: what a write checks and what it writes (no replica runs here)."""

from __future__ import annotations

import pytest

from console.models import AuditEvent, sha256_hex
from console.service_errors import ErrorCode, ServiceError
from services import services
from services.models import ReplicaState, ServiceReplica, ServiceStatus, ServiceToken
from tests.services.conftest import echo_spec


@pytest.fixture
def service(world, catalog):
    return services.service_create(tenant=world.tenant, user=world.owner, spec=echo_spec())


def test_create_writes_the_service_and_its_first_revision(service, world):
    assert service.status == ServiceStatus.DEPLOYING
    assert service.pool.on_console_host and service.region.slug == "local"
    revision = service.current_revision
    assert revision.number == 1
    assert (revision.image, revision.port, revision.cpus) == ("python:3.11-slim", 8080, 1)
    assert AuditEvent.objects.filter(action="service.created", tenant=world.tenant).exists()


def test_defaults_are_two_to_ten_replicas_and_zero_is_allowed(world, catalog):
    spec = echo_spec(name="defaults")
    spec.min_replicas, spec.max_replicas = 2, 10
    assert services.service_create(tenant=world.tenant, user=None, spec=spec).max_replicas == 10
    zero = services.service_create(
        tenant=world.tenant, user=None, spec=echo_spec(name="zero", min_replicas=0)
    )
    assert zero.status == ServiceStatus.SCALED_TO_ZERO


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"port": 0}, "port"),
        ({"port": 65536}, "port"),
        ({"min_replicas": 5, "max_replicas": 3}, "min_replicas"),
        ({"max_replicas": 11}, "max_replicas"),
        ({"readiness_path": "healthz"}, "readiness_path"),
        ({"name": "Not_A_Label"}, "name"),
        ({"name": "-x"}, "name"),
        ({"command": []}, "command"),
        ({"env": {"PORT": "1"}}, "env"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"cpus": 0}, "cpus"),
        ({"cpus": 17}, "cpus"),
        ({"region": "nowhere"}, "region"),
        ({"auth": "password"}, "auth"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(world, catalog, overrides, field):
    with pytest.raises(ServiceError) as refused:
        services.service_create(tenant=world.tenant, user=None, spec=echo_spec(**overrides))
    assert refused.value.code is ErrorCode.INVALID
    assert refused.value.field == field
    assert not ServiceReplica.objects.exists()
    assert not services.Service.objects.exists()


def test_a_name_reused_is_a_conflict(service, world):
    with pytest.raises(ServiceError) as refused:
        services.service_create(tenant=world.tenant, user=None, spec=echo_spec())
    assert refused.value.code is ErrorCode.CONFLICT


def test_another_tenant_may_use_the_same_name(service, other_world):
    other = services.service_create(tenant=other_world.tenant, user=None, spec=echo_spec())
    assert other.name == service.name


def test_only_tenants_allowed_on_this_host_may_create_services(world, catalog):
    world.tenant.may_run_on_host = False
    world.tenant.save()
    with pytest.raises(ServiceError) as refused:
        services.service_create(tenant=world.tenant, user=None, spec=echo_spec())
    assert refused.value.code is ErrorCode.FORBIDDEN
    assert not services.Service.objects.exists()


def test_changing_what_runs_makes_a_new_revision_and_scaling_does_not(service):
    service = services.service_update(service=service, user=None, changes={"min_replicas": 1})
    assert service.current_revision.number == 1
    service = services.service_update(
        service=service, user=None, changes={"env": {"MODEL": "small"}}
    )
    assert service.current_revision.number == 2
    assert service.current_revision.env == {"MODEL": "small"}
    assert service.revisions.get(number=1).env == {}  # revisions never change


def test_rollback_copies_an_earlier_revision_into_a_new_one(service):
    services.service_update(service=service, user=None, changes={"image": "python:3.12"})
    service = services.service_rollback(service=service, user=None, revision_number=1)
    current = service.current_revision
    assert (current.number, current.image, current.copied_from.number) == (3, "python:3.11-slim", 1)
    assert service.image == "python:3.11-slim"


def test_rollback_to_an_unknown_revision_is_refused(service):
    with pytest.raises(ServiceError) as refused:
        services.service_rollback(service=service, user=None, revision_number=9)
    assert refused.value.field == "revision"


def test_rollback_while_a_rollout_runs_is_a_conflict(service):
    old = service.current_revision
    services.service_update(service=service, user=None, changes={"image": "python:3.12"})
    ServiceReplica.objects.create(service=service, revision=old, state=ReplicaState.READY)
    with pytest.raises(ServiceError) as refused:
        services.service_rollback(service=service, user=None, revision_number=1)
    assert refused.value.code is ErrorCode.CONFLICT


def test_scale_checks_its_bounds(service):
    with pytest.raises(ServiceError):
        services.service_scale(service=service, user=None, min_replicas=3, max_replicas=2)
    service = services.service_scale(service=service, user=None, min_replicas=0, max_replicas=3)
    assert (service.min_replicas, service.max_replicas) == (0, 3)


def test_tokens_are_kept_as_hashes_and_shown_once(service, world):
    token, raw = services.service_token_create(service=service, user=world.owner, name="ci")
    assert raw.startswith(ServiceToken.PREFIX)
    stored = ServiceToken.objects.get()
    assert stored.key_hash == sha256_hex(raw) and raw not in (stored.prefix, stored.name)
    services.service_token_revoke(token=token, user=world.owner)
    assert not ServiceToken.objects.active().exists()


def test_a_public_service_takes_no_token(world, catalog):
    public = services.service_create(
        tenant=world.tenant, user=None, spec=echo_spec(name="open", auth="public")
    )
    with pytest.raises(ServiceError) as refused:
        services.service_token_create(service=public, user=None, name="x")
    assert refused.value.field == "auth"
