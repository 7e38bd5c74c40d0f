"""A replica's log: what its process printed, through the API (tail, bounds, 404s for
another organisation) and its page (polled while it runs)."""

from __future__ import annotations

import pytest

from services import services
from services.models import ReplicaState
from tests.conftest import signed_in_client, token_client
from tests.services.conftest import echo_spec, reconcile_until

pytestmark = pytest.mark.usefixtures("replicas_cleanup")

PRINTS = [
    "python3",
    "-u",
    "-c",
    "import http.server, os\n"
    "print('model loaded: llama-3-8b', flush=True)\n"
    "server = http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])),"
    " http.server.SimpleHTTPRequestHandler)\n"
    "server.serve_forever()\n",
]


@pytest.fixture
def replica(world, catalog):
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=echo_spec(name="talker", command=PRINTS, min_replicas=1, readiness_path="/"),
    )
    service = reconcile_until(
        service,
        lambda s: s.replicas.filter(state=ReplicaState.READY).exists(),
    )
    return service.replicas.get(state=ReplicaState.READY)


def url(replica, suffix: str = "") -> str:
    return f"/api/v1/services/{replica.service_id}/replicas/{replica.pk}/logs{suffix}"


def test_the_api_answers_the_latest_lines(replica, world, owner_api):
    answer = owner_api.get(url(replica))
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["replica"] == replica.pk and body["state"] == "ready"
    assert "model loaded: llama-3-8b" in body["lines"]
    # The readiness checks show in its access log (stderr): the last line only.
    last = owner_api.get(url(replica, "?tail=1")).json()["lines"]
    assert len(last) == 1 and last[0] == body["lines"][-1]


@pytest.mark.parametrize("tail", ["0", "5001", "abc"])
def test_a_tail_out_of_bounds_is_a_400(replica, owner_api, tail):
    answer = owner_api.get(url(replica, f"?tail={tail}"))
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid" and "tail" in answer.json()


def test_another_organisation_and_another_replica_are_404(replica, other_world, owner_api):
    outsider = token_client(other_world.owner, other_world.tenant)
    assert outsider.get(url(replica)).status_code == 404
    wrong = f"/api/v1/services/{replica.service_id}/replicas/{replica.pk + 999}/logs"
    assert owner_api.get(wrong).status_code == 404


def test_the_page_shows_the_lines_and_polls_while_it_runs(replica, world, other_world):
    page = f"/services/{replica.service_id}/replicas/{replica.pk}/logs/"
    viewer = signed_in_client(world.viewer, world.tenant)
    answer = viewer.get(page)
    assert answer.status_code == 200
    text = answer.content.decode()
    assert "model loaded: llama-3-8b" in text and 'hx-trigger="every 2s[' in text
    assert (
        f'data-replica-socket="/ws/services/{replica.service_id}/replicas/{replica.pk}/logs/"'
        in text
    )
    partial = viewer.get(page, headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<div id="replica-log"') and "<h1>" not in partial
    detail = viewer.get(f"/services/{replica.service_id}/").content.decode()
    assert page in detail  # each replica links its log
    outsider = signed_in_client(other_world.owner, other_world.tenant)
    assert outsider.get(page).status_code == 404
