"""Following a job's log over the streaming endpoint (`/jobs/<id>/logs/stream`, NDJSON):
the server's objects, its tenant scope, and the SDK resuming through broken links."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from gpugeek import AuthenticationError, Client, Cluster, Timeout

from console.services.memberships import membership_remove
from console.services.tokens import api_token_create
from tests.sdk.conftest import PRINTS_FOREVER, counting_program, cpu_spec, dispatch
from tests.sdk.proxy import LossyProxy

pytestmark = pytest.mark.integration

# Batches of about 10 lines: many chances to break a stream.
COUNT_LINES = counting_program(300, pause_every=10, pause=0.08)


def read_stream(url: str, token: str, job_id: int, since: int = 0, objects=None) -> list[dict]:
    """The objects of one stream until it ends (added to `objects` as they come)."""
    objects = [] if objects is None else objects
    headers = {"Authorization": f"Bearer {token}"}
    stream_url = f"{url}/api/v1/jobs/{job_id}/logs/stream"
    params = {"since_line": since}
    with httpx.stream("GET", stream_url, params=params, headers=headers, timeout=30) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "application/x-ndjson"
        for line in response.iter_lines():
            objects.append(json.loads(line))
    return objects


def test_stream_resumes_through_broken_links_without_gaps_or_repeats(
    gg, watcher_process, asgi_server, api_token
):
    cluster = Cluster.create(cpu_spec(COUNT_LINES))
    proxy = LossyProxy(asgi_server.url, fail_first=0, cut_streams=7)
    flaky = Client(url=proxy.url, token=api_token, retries=0)
    flaky_lines: list = []
    follower = threading.Thread(
        target=lambda: flaky_lines.extend(
            flaky.cluster(cluster.id).logs(follow=True, poll=0.1, timeout=120)
        )
    )
    follower.start()
    dispatch(cluster.id)
    direct = list(cluster.logs(follow=True, timeout=120))  # no proxy: one stream
    follower.join(timeout=60)
    flaky.close()
    proxy.close()
    expected = [(n, f"line {n}") for n in range(1, 301)]
    assert [(x.line_no, x.text) for x in direct] == expected
    assert [(x.line_no, x.text) for x in flaky_lines] == expected, "gap or repeat"
    assert cluster.job.status == "succeeded"  # from the stream's "end"
    # Each broken stream was resumed after the last whole line the client had.
    assert proxy.streams_cut >= 4 and len(proxy.stream_since) >= 8
    assert proxy.stream_since[0] == 0 and proxy.stream_since == sorted(proxy.stream_since)
    assert proxy.stream_since[-1] > 0

    # A finished job's stream: what follows since_line, then "end", at once.
    started = time.monotonic()
    objects = read_stream(asgi_server.url, api_token, cluster.id, since=296)
    assert time.monotonic() - started < 10
    lines = [line for o in objects if o["type"] == "log" for line in o["lines"]]
    assert [(x["line_no"], x["text"]) for x in lines] == expected[296:]
    assert objects[-1] == {"type": "end", "status": "succeeded", "last_line": 300}
    tail = list(cluster.logs(follow=True, since_line=298))
    assert [x.line_no for x in tail] == [299, 300]
    # Every cut stream was cleaned up on the server without a failure.
    assert "Traceback" not in asgi_server.log() and "stopped" not in asgi_server.log()


def test_stream_is_tenant_scoped_and_closes_when_access_goes(
    gg, watcher_process, asgi_server, api_token, world, other_world
):
    cluster = Cluster.create(cpu_spec(PRINTS_FOREVER))
    dispatch(cluster.id)
    url = f"{asgi_server.url}/api/v1/jobs/{cluster.id}/logs/stream"
    _, stranger = api_token_create(user=other_world.owner, tenant=other_world.tenant, name="x")
    refused = httpx.get(url, headers={"Authorization": f"Bearer {stranger}"}, timeout=30)
    assert refused.status_code == 404 and refused.json()["detail"]
    assert httpx.get(url, timeout=30).status_code in (401, 403)
    bad = httpx.get(url, params={"since_line": "x"}, timeout=30,
                    headers={"Authorization": f"Bearer {api_token}"})  # fmt: skip
    assert bad.status_code == 400 and "since_line" in bad.json()

    # A member's stream follows live lines; removing the member closes it (no "end"),
    # and their token no longer opens one.
    _, member_token = api_token_create(user=world.member, tenant=world.tenant, name="m")
    seen: list[dict] = []
    reader = threading.Thread(
        target=read_stream, args=(asgi_server.url, member_token, cluster.id, 0, seen)
    )
    reader.start()
    deadline = time.monotonic() + 30
    while not any(o["type"] == "log" for o in seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(o["type"] == "log" for o in seen), "no live lines"
    membership_remove(
        membership=world.membership(world.member), by_membership=world.membership(world.owner)
    )
    reader.join(timeout=20)
    assert not reader.is_alive(), "the stream stayed open after the member was removed"
    assert all(o["type"] != "end" for o in seen)
    numbers = [line["line_no"] for o in seen if o["type"] == "log" for line in o["lines"]]
    assert numbers == list(range(1, len(numbers) + 1))
    with Client(token=member_token) as removed, pytest.raises(AuthenticationError):
        list(removed.cluster(cluster.id).logs(follow=True, timeout=10))
    cluster.cancel()


def test_follow_timeout_and_polling_fallback(gg, watcher_process, asgi_server, api_token):
    cluster = Cluster.create(cpu_spec(PRINTS_FOREVER))
    dispatch(cluster.id)
    started = time.monotonic()
    got = []
    with pytest.raises(Timeout):
        for line in cluster.logs(follow=True, timeout=2):
            got.append(line.line_no)
    assert 1 < time.monotonic() - started < 8 and got[:3] == [1, 2, 3]

    # A server without the streaming endpoint (404 for it, the job exists): polling.
    upstream = httpx.Client(base_url=asgi_server.url, timeout=30)
    asked = []

    def older_server(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path.endswith("/logs/stream"):
            return httpx.Response(404, json={"detail": "Not found."})
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        answer = upstream.request(request.method, request.url.path, params=request.url.params,
                                  headers=headers, content=request.content)  # fmt: skip
        return httpx.Response(answer.status_code, content=answer.content,
                              headers={"Content-Type": answer.headers["content-type"]})  # fmt: skip

    old = Client(url="http://older.invalid", token=api_token,
                 transport=httpx.MockTransport(older_server))  # fmt: skip
    with old:
        polled = old.cluster(cluster.id).logs(follow=True, since_line=5, poll=0.2)
        first = [next(polled).line_no for _ in range(3)]
        polled.close()
    upstream.close()
    assert first == [6, 7, 8]
    assert any(p.endswith("/logs") for p in asked) and any("stream" in p for p in asked)
    cluster.cancel()


def test_a_quiet_job_gets_heartbeats(gg, watcher_process, asgi_server, api_token):
    """A job silent for longer than the heartbeat period: the stream says it is alive
    (so a client's read timeout tells a dead link from a quiet job), then goes on."""
    quiet = "import time; print('before', flush=True); time.sleep(11); print('after')"
    cluster = Cluster.create(cpu_spec(quiet))
    dispatch(cluster.id)
    objects = read_stream(asgi_server.url, api_token, cluster.id)
    kinds = [o["type"] for o in objects if o["type"] != "status"]
    first, last = kinds.index("log"), len(kinds) - 1 - kinds[::-1].index("log")
    assert "heartbeat" in kinds[first:last], kinds
    lines = [line["text"] for o in objects if o["type"] == "log" for line in o["lines"]]
    assert lines == ["before", "after"] and objects[-1]["type"] == "end"
