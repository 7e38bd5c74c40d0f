"""The services API: shapes, bad input in the error envelope, and other tenants' 404s."""

from __future__ import annotations

import pytest

from services import reconcile, services, traffic
from services.models import ReplicaState, ServiceReplica
from tests.conftest import token_client
from tests.services.conftest import echo_spec

BODY = {
    "name": "echo",
    "image": "python:3.11-slim",
    "command": ["python3", "-m", "http.server"],
    "port": 8080,
    "region": "local",
    "readiness_path": "/",
}


@pytest.fixture
def created(owner_api, catalog):
    answer = owner_api.post("/api/v1/services", BODY, format="json")
    assert answer.status_code == 201, answer.json()
    return answer.json()


def test_create_answers_status_replicas_revision_and_endpoint(created):
    assert created["status"] == "deploying"
    assert (created["revision"], created["ready_replicas"], created["replicas"]) == (1, 0, 0)
    assert created["endpoint_url"] == "http://testserver/svc/acme/echo/"
    assert (created["min_replicas"], created["max_replicas"], created["auth"]) == (2, 10, "token")
    assert created["autoscale"] == {
        "metric": "concurrency", "target": 10.0, "scale_down_delay": 300,
    }  # fmt: skip
    assert created["desired_replicas"] == 2


def test_autoscale_is_set_at_creation_and_changed_by_patch(owner_api, catalog):
    body = {**BODY, "autoscale": {"metric": "rps", "target": 2.5}}
    created = owner_api.post("/api/v1/services", body, format="json").json()
    assert created["autoscale"] == {"metric": "rps", "target": 2.5, "scale_down_delay": 300}
    url = f"/api/v1/services/{created['id']}"
    changed = owner_api.patch(url, {"autoscale": {"target": 4}}, format="json").json()
    assert changed["autoscale"] == {"metric": "rps", "target": 4.0, "scale_down_delay": 300}
    assert changed["revision"] == 1  # scaling is no new revision
    changed = owner_api.patch(url, {"autoscale": {"scale_down_delay": 30}}, format="json")
    assert changed.json()["autoscale"]["scale_down_delay"] == 30


@pytest.mark.parametrize(
    ("autoscale", "field", "words"),
    [
        ({"metric": "cpu", "target": 70}, "autoscale_metric", "rps or concurrency"),
        ({"metric": "gpu"}, "autoscale_metric", "needs GPU replicas"),
        ({"metric": "memory"}, "autoscale", "not a valid choice"),
        ({"target": 0}, "autoscale", "greater than or equal to 0.01"),
        ({"scale_down_delay": 3601}, "autoscale", "less than or equal to 3600"),
        ({"scale_down_delay": "soon"}, "autoscale", "valid integer"),
    ],
)
def test_an_autoscale_the_console_cannot_do_is_a_400(owner_api, catalog, autoscale, field, words):
    answer = owner_api.post("/api/v1/services", {**BODY, "autoscale": autoscale}, format="json")
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "invalid" and field in body and words in str(body)


def test_list_and_retrieve(owner_api, created, django_assert_max_num_queries):
    with django_assert_max_num_queries(12):
        listed = owner_api.get("/api/v1/services").json()
    assert [row["name"] for row in listed["results"]] == ["echo"]
    assert owner_api.get(f"/api/v1/services/{created['id']}").json()["name"] == "echo"


@pytest.mark.parametrize(
    ("change", "status", "field"),
    [
        ({"port": 70000}, 400, "port"),
        ({"min_replicas": 4, "max_replicas": 2}, 400, "min_replicas"),
        ({"max_replicas": 50}, 400, "max_replicas"),
        ({"readiness_path": "ready"}, 400, "readiness_path"),
        ({"command": "python3 serve.py"}, 400, "command"),
        ({"port": "8080"}, 201, None),
    ],
)
def test_bad_input_is_a_400_in_the_envelope(owner_api, catalog, change, status, field):
    answer = owner_api.post("/api/v1/services", {**BODY, **change}, format="json")
    assert answer.status_code == status, answer.json()
    if field:
        body = answer.json()
        assert body["code"] == "invalid" and body["detail"] and field in body


def test_a_name_reused_is_a_409(owner_api, created):
    answer = owner_api.post("/api/v1/services", BODY, format="json")
    assert answer.status_code == 409
    assert answer.json()["code"] == "conflict"


def test_patch_makes_a_revision_and_revisions_lists_them(owner_api, created):
    url = f"/api/v1/services/{created['id']}"
    answer = owner_api.patch(url, {"image": "python:3.12-slim"}, format="json")
    assert answer.status_code == 200 and answer.json()["revision"] == 2
    revisions = owner_api.get(f"{url}/revisions").json()
    assert [(r["number"], r["image"]) for r in revisions] == [
        (2, "python:3.12-slim"),
        (1, "python:3.11-slim"),
    ]


def test_rollback_and_its_refusals(owner_api, created):
    url = f"/api/v1/services/{created['id']}"
    owner_api.patch(url, {"image": "python:3.12-slim"}, format="json")
    assert owner_api.post(f"{url}/rollback", {"revision": 7}, format="json").status_code == 400
    answer = owner_api.post(f"{url}/rollback", {"revision": 1}, format="json")
    assert answer.status_code == 200 and answer.json()["revision"] == 3
    assert answer.json()["image"] == "python:3.11-slim"
    service = services.Service.objects.get()
    ServiceReplica.objects.create(
        service=service, revision=service.revisions.get(number=1), state=ReplicaState.READY
    )
    answer = owner_api.post(f"{url}/rollback", {"revision": 2}, format="json")
    assert answer.status_code == 409 and answer.json()["code"] == "conflict"


def test_scale(owner_api, created):
    url = f"/api/v1/services/{created['id']}/scale"
    answer = owner_api.post(url, {"min_replicas": 0, "max_replicas": 3}, format="json")
    assert answer.status_code == 200
    assert (answer.json()["min_replicas"], answer.json()["max_replicas"]) == (0, 3)
    refused = owner_api.post(url, {"min_replicas": 3, "max_replicas": 1}, format="json")
    assert refused.status_code == 400


@pytest.mark.usefixtures("replicas_cleanup")
def test_scale_events_say_what_decided(owner_api, world, catalog):
    zero = services.service_create(
        tenant=world.tenant, user=None, spec=echo_spec(name="zero", min_replicas=0)
    )
    traffic.held_enter(service_id=zero.pk)  # a request waits at the gateway
    reconcile.service_reconcile(service_id=zero.pk)
    events = owner_api.get(f"/api/v1/services/{zero.pk}/scale-events").json()
    assert len(events) == 1
    event = events[0]
    assert (event["from_replicas"], event["to_replicas"], event["window"]) == (0, 1, "cold_start")
    assert (event["held_requests"], event["cold_start_seconds"]) == (1, None)
    assert {"at", "metric", "target", "stable_value", "panic_value"} <= set(event)
    assert owner_api.get(f"/api/v1/services/{zero.pk}").json()["desired_replicas"] == 1


def test_tokens_are_shown_once_listed_and_revoked(owner_api, created):
    url = f"/api/v1/services/{created['id']}/tokens"
    made = owner_api.post(url, {"name": "ci"}, format="json")
    assert made.status_code == 201 and made.json()["token"].startswith("ggs_")
    listed = owner_api.get(url).json()
    assert [t["name"] for t in listed] == ["ci"] and "token" not in listed[0]
    assert owner_api.delete(f"{url}/{made.json()['id']}").status_code == 204
    assert owner_api.get(url).json()[0]["revoked_at"]


def test_a_token_on_a_public_service_is_a_400(owner_api, catalog):
    public = owner_api.post("/api/v1/services", {**BODY, "auth": "public"}, format="json").json()
    answer = owner_api.post(f"/api/v1/services/{public['id']}/tokens", {"name": "x"}, format="json")
    assert answer.status_code == 400 and "auth" in answer.json()


def test_delete(owner_api, created):
    assert owner_api.delete(f"/api/v1/services/{created['id']}").status_code == 204
    assert owner_api.get("/api/v1/services").json()["results"] == []


def test_a_viewer_may_read_but_not_deploy(world, created):
    viewer = token_client(world.viewer, world.tenant)
    assert viewer.get("/api/v1/services").status_code == 200
    assert viewer.post("/api/v1/services", {**BODY, "name": "x"}, format="json").status_code == 403


def test_every_url_is_a_404_for_another_tenant(world, other_world, catalog):
    foreign = services.service_create(
        tenant=other_world.tenant, user=None, spec=echo_spec(name="globex-secret-svc")
    )
    token, _ = services.service_token_create(service=foreign, user=None, name="t")
    client = token_client(world.owner, world.tenant)
    base = f"/api/v1/services/{foreign.pk}"
    cases = [
        ("get", base, None),
        ("patch", base, {"min_replicas": 0}),
        ("delete", base, None),
        ("post", f"{base}/rollback", {"revision": 1}),
        ("post", f"{base}/scale", {"min_replicas": 0, "max_replicas": 1}),
        ("get", f"{base}/revisions", None),
        ("get", f"{base}/replicas", None),
        ("get", f"{base}/scale-events", None),
        ("get", f"{base}/tokens", None),
        ("post", f"{base}/tokens", {"name": "mine"}),
        ("delete", f"{base}/tokens/{token.pk}", None),
    ]
    for method, url, body in cases:
        answer = getattr(client, method)(url, body, format="json")
        assert answer.status_code == 404, (method, url, answer.status_code)
        assert "globex-secret-svc" not in answer.content.decode()
    assert client.get("/api/v1/services").json()["results"] == []
    foreign.refresh_from_db()
    assert (foreign.min_replicas, foreign.tokens.active().count()) == (2, 1)
