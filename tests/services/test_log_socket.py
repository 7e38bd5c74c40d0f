"""A replica's log over the live socket: the latest lines at once, then only the new ones
with the replica's state, the end when it stops; refused to anonymous people (4403) and
to another organisation, whose replica is unknown (4404), as its pages answer 404."""

from __future__ import annotations

import time

import pytest

from jobs.realtime import parallel_db
from services import reconcile, services
from services.consumers import FIRST_LINES
from services.logs import lines_after
from services.models import ReplicaState
from tests.jobs.test_consumers import TIMEOUT, communicator, refused, run, session_cookie
from tests.services.conftest import echo_spec, reconcile_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replicas_cleanup")]

# Prints a numbered line every 0.2 s while it serves. One write per line, and no request
# log on stderr: print() writes the text and its newline apart, so a readiness probe's log
# line could land between them in the one log file.
TICKER = [
    "python3",
    "-u",
    "-c",
    "import http.server, os, sys, threading, time\n"
    "class Quiet(http.server.SimpleHTTPRequestHandler):\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "def tick():\n"
    "    for n in range(1, 10_000):\n"
    "        sys.stdout.write(f'tick {n}\\n')\n"
    "        time.sleep(0.2)\n"
    "threading.Thread(target=tick, daemon=True).start()\n"
    "http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])), Quiet)"
    ".serve_forever()\n",
]


@pytest.fixture
def replica(world, catalog):
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=echo_spec(name="ticker", command=TICKER, min_replicas=1, readiness_path="/"),
    )
    service = reconcile_until(
        service, lambda s: s.replicas.filter(state=ReplicaState.READY).exists()
    )
    return service.replicas.get(state=ReplicaState.READY)


def path(replica) -> str:
    return f"/ws/services/{replica.service_id}/replicas/{replica.pk}/logs/"


def numbers(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("tick ")]


def test_the_socket_sends_the_latest_lines_then_only_new_ones_until_the_replica_stops(
    replica, world
):
    viewer = session_cookie(world.viewer, world.tenant)

    async def body():
        socket = communicator(path(replica), cookie=viewer)
        connected, _ = await socket.connect(timeout=TIMEOUT)
        assert connected
        first = await socket.receive_json_from(timeout=TIMEOUT)
        assert first["type"] == "replica_log" and first["state"] == ReplicaState.READY
        seen = numbers(first["lines"])
        assert seen and first["error"] == ""
        deadline = time.monotonic() + TIMEOUT
        while seen[-1] < seen[0] + 10 and time.monotonic() < deadline:
            message = await socket.receive_json_from(timeout=TIMEOUT)
            seen += numbers(message["lines"])
        # Every tick once, in order, none repeated, none missing.
        assert seen == list(range(seen[0], seen[-1] + 1))
        await socket.disconnect()

    run(body)

    async def stopped():
        socket = communicator(path(replica), cookie=viewer)
        connected, _ = await socket.connect(timeout=TIMEOUT)
        assert connected
        await socket.receive_json_from(timeout=TIMEOUT)
        await parallel_db(reconcile.replica_stop)(replica, "scaled down")
        while True:
            message = await socket.receive_json_from(timeout=TIMEOUT)
            if message["state"] == ReplicaState.STOPPED:
                break
        assert message["reason"] == "scaled down"
        closed = await socket.receive_output(timeout=TIMEOUT)
        assert closed["type"] == "websocket.close"

    run(stopped)


def test_anonymous_and_other_organisations_are_refused(replica, world, other_world):
    assert run(lambda: refused(path(replica))) == 4403
    outsider = session_cookie(other_world.owner, other_world.tenant)
    assert run(lambda: refused(path(replica), cookie=outsider)) == 4404
    # A replica id that isn't the service's is unknown too.
    member = session_cookie(world.viewer, world.tenant)
    wrong = f"/ws/services/{replica.service_id}/replicas/{replica.pk + 1000}/logs/"
    assert run(lambda: refused(wrong, cookie=member)) == 4404


@pytest.mark.parametrize(
    ("previous", "current", "new"),
    [
        ([], ["a", "b"], ["a", "b"]),
        (["a", "b"], ["a", "b"], []),
        (["a", "b"], ["a", "b", "c"], ["c"]),
        (["a", "b", "c"], ["b", "c", "d"], ["d"]),  # the tail moved on
        (["a", "b"], ["x", "y"], ["x", "y"]),  # nothing in common: all of it
        (["x", "x"], ["x", "x", "x"], ["x"]),  # repeated lines: the longest overlap
    ],
)
def test_lines_after_is_what_a_later_tail_adds(previous, current, new):
    assert lines_after(previous, current) == new
    assert FIRST_LINES >= 100
