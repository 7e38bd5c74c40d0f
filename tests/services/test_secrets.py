"""Organisation secrets in services: named in the spec (never their values), checked by
the same rules as a job's (exists, the user's role), set in each replica's environment
when it starts, part of the revision, and a replica that can't get one says why."""

from __future__ import annotations

import httpx
import pytest

from jobs.backends import host_processes
from jobs.models import TenantSecret
from jobs.services import tenant_secret_delete, tenant_secret_set
from services import reconcile, services
from services.models import ReplicaState, ServiceStatus
from tests.conftest import token_client
from tests.services.conftest import echo_spec, reconcile_until

pytestmark = pytest.mark.usefixtures("replicas_cleanup")

VALUE = "from-an-organisation-secret"


@pytest.fixture
def secret(world):
    # Owners' and admins' services only (members_may_use is off).
    return tenant_secret_set(
        tenant=world.tenant, user=world.owner, name="REPLICA_NAME", value=VALUE
    )


def body(**overrides):
    values = {
        "name": "echo",
        "image": "python:3.11-slim",
        "command": echo_spec().command,
        "port": 8080,
        "region": "local",
        "readiness_path": "/healthz",
        "min_replicas": 1,
        "secrets": ["REPLICA_NAME"],
    }
    values.update(overrides)
    return values


def test_a_replica_gets_the_secret_value_and_the_api_only_its_name(owner_api, catalog, secret):
    answer = owner_api.post("/api/v1/services", body(), format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["secrets"] == ["REPLICA_NAME"] and VALUE not in answer.content.decode()
    service = services.Service.objects.get(pk=answer.json()["id"])
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    replica = service.replicas.get(state=ReplicaState.READY)
    seen = httpx.get(f"http://127.0.0.1:{replica.host_port}/whoami", timeout=10).json()
    assert seen["replica"] == VALUE
    revisions = owner_api.get(f"/api/v1/services/{service.pk}/revisions").json()
    rows = revisions["results"] if isinstance(revisions, dict) else revisions
    assert rows[0]["secrets"] == ["REPLICA_NAME"] and VALUE not in str(rows)


@pytest.mark.parametrize(
    ("secrets", "env", "says"),
    [
        (["NO_SUCH"], {}, "No secret named NO_SUCH"),
        (["REPLICA_NAME"], {"REPLICA_NAME": "x"}, "set twice"),
        ("REPLICA_NAME", {}, "list"),
    ],
)
def test_bad_secrets_are_a_400_on_the_field(owner_api, catalog, secret, secrets, env, says):
    answer = owner_api.post("/api/v1/services", body(secrets=secrets, env=env), format="json")
    assert answer.status_code == 400, answer.json()
    assert says in str(answer.json()) and "secrets" in str(answer.json())
    assert not services.Service.objects.exists()


def test_a_member_may_not_use_an_owners_secret_nor_change_what_reads_it(
    world, catalog, secret, owner_api
):
    member_api = token_client(world.member, world.tenant)
    answer = member_api.post("/api/v1/services", body(), format="json")
    assert answer.status_code == 400 and "owners' and admins'" in str(answer.json())
    created = owner_api.post("/api/v1/services", body(min_replicas=0), format="json").json()
    # A new command could print the secret: the member can't make one.
    change = {"command": ["python3", "-c", "import os; print(os.environ)"]}
    answer = member_api.patch(f"/api/v1/services/{created['id']}", change, format="json")
    assert answer.status_code == 400 and "owners' and admins'" in str(answer.json())
    # Scaling is not a new revision: the member may.
    answer = member_api.patch(
        f"/api/v1/services/{created['id']}", {"max_replicas": 3}, format="json"
    )
    assert answer.status_code == 200, answer.json()


def test_changing_the_secrets_makes_a_revision_and_rolling_back_checks_them(world, catalog, secret):
    service = services.service_create(
        tenant=world.tenant, user=world.owner, spec=echo_spec(min_replicas=0, secrets=[])
    )
    service = services.service_update(
        service=service, user=world.owner, changes={"secrets": ["REPLICA_NAME"]}
    )
    assert service.current_revision.number == 2 and service.current_revision.secrets == [
        "REPLICA_NAME"
    ]
    service = services.service_update(service=service, user=world.owner, changes={"secrets": []})
    tenant_secret_delete(secret=TenantSecret.objects.get(pk=secret.pk), user=world.owner)
    with pytest.raises(services.ServiceError, match="No secret named REPLICA_NAME"):
        services.service_rollback(service=service, user=world.owner, revision_number=2)


def test_a_replica_whose_secret_is_gone_does_not_start_and_says_why(world, catalog, secret):
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=echo_spec(min_replicas=1, secrets=["REPLICA_NAME"]),
    )
    tenant_secret_delete(secret=TenantSecret.objects.get(pk=secret.pk), user=world.owner)
    service = reconcile.service_reconcile(service_id=service.pk)
    replica = service.replicas.get()
    assert replica.state == ReplicaState.STOPPED
    assert "REPLICA_NAME no longer exists" in replica.reason
    assert not host_processes.host_running(replica.handle)
