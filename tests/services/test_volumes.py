"""Volumes in services: the organisation's volumes, named in the spec, mounted read-only in
every replica (model weights); part of the revision; checked on create, change and
rollback; a volume a service's replicas mount can't be deleted; a replica on the console's
host reads what the volume holds and can't write to it."""

from __future__ import annotations

import httpx
import pytest

from console.service_errors import ServiceError
from jobs.backends import host_processes
from jobs.backends.local_volumes import fill_folder
from services import reconcile, services
from services.models import ReplicaState, ServiceStatus
from storage.services import volume_delete
from tests.conftest import token_client
from tests.factories import RegionFactory, TenantFactory, VolumeFactory
from tests.services.conftest import echo_spec, reconcile_until

pytestmark = pytest.mark.usefixtures("replicas_cleanup")

# A replica that answers what /models/weights.txt holds and whether it could write beside it.
READER = r"""
import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        seen = {}
        try:
            seen["weights"] = open("/models/weights.txt").read()
        except OSError as error:
            seen["weights"] = f"unreadable: {error}"
        try:
            open("/models/written.txt", "w").write("x")
            seen["write"] = "written"
        except OSError as error:
            seen["write"] = error.strerror
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("0.0.0.0", int(os.environ["PORT"])), Handler).serve_forever()
"""


@pytest.fixture
def weights(world):
    return VolumeFactory(tenant=world.tenant, name="weights", size_gib=1)


def body(**overrides):
    values = {
        "name": "echo",
        "image": "python:3.11-slim",
        "command": echo_spec().command,
        "port": 8080,
        "region": "local",
        "readiness_path": "/healthz",
        "min_replicas": 0,
        "volumes": [{"name": "weights", "path": "/models"}],
    }
    values.update(overrides)
    return values


def test_the_volumes_are_part_of_the_service_and_its_revision(owner_api, catalog, weights):
    answer = owner_api.post(
        "/api/v1/services",
        body(volumes=[{"name": "weights", "path": "/models", "read_only": True}]),
        format="json",
    )
    assert answer.status_code == 201, answer.json()
    created = answer.json()
    assert created["volumes"] == [{"name": "weights", "path": "/models"}]
    service_id = created["id"]
    # Another path is a new revision; rolling back mounts the first one again.
    answer = owner_api.patch(
        f"/api/v1/services/{service_id}",
        {"volumes": [{"name": "weights", "path": "/weights"}]},
        format="json",
    )
    assert answer.status_code == 200, answer.json()
    assert answer.json()["revision"] == 2
    revisions = owner_api.get(f"/api/v1/services/{service_id}/revisions").json()
    rows = revisions["results"] if isinstance(revisions, dict) else revisions
    assert [(row["number"], row["volumes"]) for row in rows] == [
        (2, [{"name": "weights", "path": "/weights"}]),
        (1, [{"name": "weights", "path": "/models"}]),
    ]
    answer = owner_api.post(f"/api/v1/services/{service_id}/rollback", {"revision": 1})
    assert answer.status_code == 200, answer.json()
    assert answer.json()["volumes"] == [{"name": "weights", "path": "/models"}]
    # Scaling is no new revision.
    answer = owner_api.patch(f"/api/v1/services/{service_id}", {"max_replicas": 3}, format="json")
    assert answer.json()["revision"] == 3


@pytest.mark.parametrize(
    ("volumes", "says"),
    [
        ([{"name": "nope", "path": "/models"}], "No volume named nope"),
        ([{"name": "weights", "path": "/models", "read_only": False}], "read-only"),
        ([{"name": "weights", "path": "models"}], "absolute path"),
        ([{"name": "weights", "path": "/proc/x"}], "belong to the system"),
        ([{"name": "weights", "path": "/a"}, {"name": "weights", "path": "/b"}], "twice"),
        ([{"name": "weights"}], "path"),
        ("weights:/models", "list"),
    ],
)
def test_bad_volumes_are_a_400_on_the_field(owner_api, catalog, weights, volumes, says):
    answer = owner_api.post("/api/v1/services", body(volumes=volumes), format="json")
    assert answer.status_code == 400, answer.json()
    assert says in str(answer.json()) and "volumes" in str(answer.json())
    assert not services.Service.objects.exists()


def test_another_organisations_or_regions_volume_is_not_mountable(world, owner_api, catalog):
    VolumeFactory(tenant=TenantFactory(slug="globex"), name="theirs")
    VolumeFactory(tenant=world.tenant, name="far", region=RegionFactory(slug="far-away"))
    answer = owner_api.post(
        "/api/v1/services", body(volumes=[{"name": "theirs", "path": "/m"}]), format="json"
    )
    assert answer.status_code == 400 and "No volume named theirs" in str(answer.json())
    answer = owner_api.post(
        "/api/v1/services", body(volumes=[{"name": "far", "path": "/m"}]), format="json"
    )
    assert answer.status_code == 400 and "only usable in its region" in str(answer.json())


def test_a_mounted_volume_is_not_deleted_until_no_replica_mounts_it(world, catalog, weights):
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=echo_spec(min_replicas=0, volumes=[{"name": "weights", "path": "/models"}]),
    )
    with pytest.raises(ServiceError, match="mounted by the replicas of service “echo”") as error:
        volume_delete(volume=weights, user=world.owner)
    assert error.value.code == "conflict"
    api = token_client(world.owner, world.tenant)
    answer = api.delete(f"/api/v1/volumes/{weights.pk}")
    assert answer.status_code == 409 and answer.json()["code"] == "conflict"
    assert "“echo”" in answer.json()["detail"]
    services.service_update(service=service, user=world.owner, changes={"volumes": []})
    volume_delete(volume=weights, user=world.owner)
    weights.refresh_from_db()
    assert weights.deleted_at is not None
    # The revision that mounted it can't come back: it says why.
    with pytest.raises(ServiceError, match="No volume named weights"):
        services.service_rollback(service=service, user=world.owner, revision_number=1)


def test_a_replica_whose_volume_is_gone_does_not_start_and_says_why(world, catalog, weights):
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=echo_spec(min_replicas=0, volumes=[{"name": "weights", "path": "/models"}]),
    )
    weights.delete()  # (as if removed behind the console's back)
    services.service_scale(service=service, user=world.owner, min_replicas=1, max_replicas=2)
    service = reconcile.service_reconcile(service_id=service.pk)
    replica = service.replicas.get()
    assert replica.state == ReplicaState.STOPPED
    assert "No volume named weights" in replica.reason
    assert not host_processes.host_running(replica.handle)


def test_a_replica_reads_the_volume_and_can_not_write_to_it(world, catalog, weights):
    folder = fill_folder(tenant_id=world.tenant.pk, volume_id=weights.pk)
    (folder / "weights.txt").write_text("layer-0: 0.125")
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=echo_spec(
            min_replicas=1,
            command=["python3", "-c", READER],
            readiness_path="/",
            volumes=[{"name": "weights", "path": "/models"}],
        ),
    )
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    replica = service.replicas.get(state=ReplicaState.READY)
    seen = httpx.get(f"http://127.0.0.1:{replica.host_port}/", timeout=10).json()
    assert seen == {"weights": "layer-0: 0.125", "write": "Read-only file system"}
    assert not (folder / "written.txt").exists()
