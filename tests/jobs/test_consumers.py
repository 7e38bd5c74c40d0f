"""The job and tenant sockets through the real ASGI stack (Origin check, session auth,
routing) with `WebsocketCommunicator`, on the real Redis channel layer.

Refusals: anonymous, foreign Origin, another tenant's job, an unknown job are closed
before the handshake completes (the server answers those with HTTP 403; tests/e2e checks
that on a real server). Logs: backfill, live lines, resume, masking."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.conf import settings

from console.asgi import application
from console.crypto import encrypt_json
from jobs import consumers, realtime
from jobs.actors import BACKEND
from jobs.logs.archive import archive_index_path, archive_path
from jobs.logs.follower import close_for_loop, followers
from jobs.logs.stores import FileLog, spool_dir
from jobs.models import Job, JobStatus
from jobs.state import job_transition
from tests.conftest import signed_in_client
from tests.factories import JobFactory, UserFactory
from tests.jobs_helpers import advance_to

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = b"http://127.0.0.1"
TIMEOUT = 5


def make_job(tenant, *, status=JobStatus.RUNNING, **fields) -> Job:
    """A local CPU job of `tenant`, brought to `status` through the state machine."""
    job = JobFactory(tenant=tenant, **{"name": "socket test", **fields})
    forget_files(job)
    return job if status == JobStatus.QUEUED else advance_to(job, status)


def forget_files(job: Job) -> None:
    """Rolled-back tests reuse ids: start from no files of an earlier job with this id."""
    for leftover in (
        Path(settings.DATA_DIR) / "jobs" / str(job.pk),
        spool_dir(job),
    ):
        shutil.rmtree(leftover, ignore_errors=True)
    archive_path(job).unlink(missing_ok=True)
    archive_index_path(archive_path(job)).unlink(missing_ok=True)
    FileLog.forget(Path(settings.DATA_DIR) / "jobs" / str(job.pk) / "output.log")


def write_log(job: Job, lines: list[str], mode: str = "a") -> Path:
    path = Path(settings.DATA_DIR) / "jobs" / str(job.pk) / "output.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as handle:
        handle.writelines(f"{line}\n" for line in lines)
    return path


def session_cookie(user, tenant=None) -> bytes:
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={signed_in_client(user, tenant).cookies[name].value}".encode()


def communicator(path: str, *, cookie: bytes | None = None, origin: bytes | None = ORIGIN):
    headers = [(b"host", b"127.0.0.1")]
    if origin is not None:
        headers.append((b"origin", origin))
    if cookie is not None:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


def run(coroutine_function):
    """Run an async test body on one event loop, then stop that loop's hub and followers."""

    # A channel layer's receive machinery belongs to one event loop: a fresh one per run.
    channel_layers.backends.clear()

    async def body():
        try:
            return await coroutine_function()
        finally:
            await close_for_loop()
            await realtime.close_hub()
            await settle_other_tasks()

    return async_to_sync(body)()


async def settle_other_tasks(timeout: float = 10) -> None:
    """Cancel what is still running on this loop (a socket's last fill, a re-check) and
    wait for it while the test body still runs. asgiref finishes a cancelled database
    call before the task ends, and a thread-sensitive one runs on this test's main thread,
    which serves such calls only until the body returns: a task left for the loop's own
    shutdown would wait for it for ever."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=timeout)


async def refused(path: str, **options) -> int:
    socket = communicator(path, **options)
    connected, code = await socket.connect(timeout=TIMEOUT)
    await socket.disconnect()
    assert not connected, f"{path} was accepted"
    return code


async def receive_lines(socket, until_line: int, timeout: float = TIMEOUT) -> list[dict]:
    """Log lines received until `until_line` arrives (other messages are skipped)."""
    lines: list[dict] = []
    while not lines or lines[-1]["line_no"] < until_line:
        message = await socket.receive_json_from(timeout=timeout)
        if message["type"] == "log":
            lines.extend(message["lines"])
    return lines


def assert_contiguous(lines: list[dict], first: int, last: int) -> None:
    numbers = [line["line_no"] for line in lines]
    assert numbers == list(range(first, last + 1)), (numbers[:5], numbers[-5:])


# --- refusals -------------------------------------------------------------------------------


def test_anonymous_socket_is_refused(world, catalog):
    job = make_job(world.tenant)
    assert run(lambda: refused(f"/ws/jobs/{job.pk}/")) == 4403
    assert run(lambda: refused("/ws/tenant/")) == 4403


def test_foreign_or_missing_origin_is_refused(world, catalog):
    job = make_job(world.tenant)
    cookie = session_cookie(world.member, world.tenant)
    run(lambda: refused(f"/ws/jobs/{job.pk}/", cookie=cookie, origin=b"http://evil.example"))
    run(lambda: refused(f"/ws/jobs/{job.pk}/", cookie=cookie, origin=None))
    run(lambda: refused("/ws/tenant/", cookie=cookie, origin=b"http://evil.example"))


def test_another_tenants_job_and_unknown_jobs_are_refused(world, other_world, catalog):
    foreign = make_job(other_world.tenant)
    cookie = session_cookie(world.member, world.tenant)
    assert run(lambda: refused(f"/ws/jobs/{foreign.pk}/", cookie=cookie)) == 4403
    assert run(lambda: refused("/ws/jobs/999999/", cookie=cookie)) == 4404
    run(lambda: refused("/ws/elsewhere/", cookie=cookie))  # the catch-all refusal stays
    # A user of no tenant at all gets no tenant socket.
    loner = session_cookie(UserFactory(email="loner@nowhere.test"))
    assert run(lambda: refused("/ws/tenant/", cookie=loner)) == 4403


# --- status -------------------------------------------------------------------------------------


def test_job_socket_sends_status_now_and_on_every_change(world, catalog):
    job = make_job(world.tenant, status=JobStatus.RUNNING)
    cookie = session_cookie(world.viewer, world.tenant)  # viewers may watch

    async def body():
        socket = communicator(f"/ws/jobs/{job.pk}/", cookie=cookie)
        connected, _ = await socket.connect(timeout=TIMEOUT)
        assert connected
        first = await socket.receive_json_from(timeout=TIMEOUT)
        assert first["type"] == "status" and first["status"] == "running"
        await asyncio.sleep(0.3)  # the hub has joined the group
        from channels.db import database_sync_to_async

        await database_sync_to_async(job_transition)(
            job=job, to=JobStatus.SUCCEEDED, actor=BACKEND, reason="completed"
        )
        while True:
            message = await socket.receive_json_from(timeout=TIMEOUT)
            if message["type"] == "status":
                break
        assert message["status"] == "succeeded" and message["is_finished"] is True
        assert message["job_id"] == job.pk
        await socket.disconnect()

    run(body)


def test_a_change_between_the_first_read_and_the_subscription_is_not_lost(
    world, catalog, monkeypatch
):
    """The job changes after the socket first read it and before it joined the job's
    group (its event reaches nobody): the status the socket sends is still the new one."""

    job = make_job(world.tenant, status=JobStatus.RUNNING)
    cookie = session_cookie(world.viewer, world.tenant)
    reads = []

    def reload_then_change(job_id):
        found = Job.objects.filter(pk=job_id).first()
        if not reads:  # the first read, then the change nobody subscribed yet hears of
            Job.objects.filter(pk=job_id).update(status=JobStatus.PAUSING)
        reads.append(job_id)
        return found

    monkeypatch.setattr(consumers, "reload_job", database_sync_to_async(reload_then_change))

    async def body():
        socket = communicator(f"/ws/jobs/{job.pk}/", cookie=cookie)
        connected, _ = await socket.connect(timeout=TIMEOUT)
        assert connected
        first = await socket.receive_json_from(timeout=TIMEOUT)
        assert first["type"] == "status" and first["status"] == "pausing"
        await socket.disconnect()

    run(body)
    assert len(reads) >= 2


def test_tenant_socket_gets_its_tenants_job_changes_only(world, other_world, catalog):
    mine = make_job(world.tenant)
    theirs = make_job(other_world.tenant)
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        from channels.db import database_sync_to_async

        socket = communicator("/ws/tenant/", cookie=cookie)
        connected, _ = await socket.connect(timeout=TIMEOUT)
        assert connected
        await asyncio.sleep(0.3)
        await database_sync_to_async(job_transition)(
            job=theirs, to=JobStatus.FAILED, actor=BACKEND, reason="boom"
        )
        await database_sync_to_async(job_transition)(
            job=mine, to=JobStatus.SUCCEEDED, actor=BACKEND, reason="completed"
        )
        message = await socket.receive_json_from(timeout=TIMEOUT)
        assert message["type"] == "status"
        assert (message["job_id"], message["status"]) == (mine.pk, "succeeded")
        assert await socket.receive_nothing(timeout=0.3)
        await socket.disconnect()

    run(body)


def test_dashboard_job_list_is_a_live_section_refreshed_on_state_changes(world, catalog):
    """The dashboard's job list listens to the tenant socket (tenant_live.js turns each
    status message into `gg:tenant-job-changed`) and refetches itself as a partial."""
    job = make_job(world.tenant, name="dash job", status=JobStatus.RUNNING)
    make_job(world.tenant, name="queued one", status=JobStatus.QUEUED)
    client = signed_in_client(world.member, world.tenant)
    page = client.get("/").content.decode()
    assert re.search(r"js/tenant_live(\.[0-9a-f]+)?\.js", page)  # hashed name
    assert 'id="dashboard-jobs"' in page and "data-tenant-live" in page
    assert "gg:tenant-job-changed from:body" in page
    assert f'data-job="{job.pk}"' in page and "No jobs yet" not in page

    job_transition(job=job, to=JobStatus.SUCCEEDED, actor=BACKEND, reason="completed")
    partial = client.get("/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="dashboard-jobs")
    body = partial.content.decode()
    assert body.lstrip().startswith('<section id="dashboard-jobs"')  # the section only
    assert f'data-job="{job.pk}"' in body and 'data-status="succeeded"' in body
    # The running count comes along, swapped out of band.
    assert 'id="running-jobs-stat"' in body and 'hx-swap-oob="true"' in body
    assert '<span class="stat-value" data-testid="running-count">0</span>' in body


# --- logs -----------------------------------------------------------------------------------------


def test_backfill_then_live_lines_without_gap_or_duplicate(world, catalog):
    job = make_job(world.tenant)
    write_log(job, [f"line {n}" for n in range(1, 1501)])
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        socket = communicator(f"/ws/jobs/{job.pk}/", cookie=cookie)
        assert (await socket.connect(timeout=TIMEOUT))[0]
        backfill = await receive_lines(socket, 1500)
        assert_contiguous(backfill, 501, 1500)  # the last 1,000 lines
        assert backfill[0]["text"] == "line 501" and backfill[0]["rank"] == 0
        assert backfill[0]["ts"]
        # Live: written in several bursts, one line still being written at first.
        for start in range(1501, 1601, 20):
            write_log(job, [f"line {n}" for n in range(start, start + 20)])
            await asyncio.sleep(0.03)
        path = Path(settings.DATA_DIR) / "jobs" / str(job.pk) / "output.log"
        with path.open("a") as handle:
            handle.write("partial")
        live = await receive_lines(socket, 1600)
        assert_contiguous(live, 1501, 1600)
        assert live[-1]["text"] == "line 1600"
        with path.open("a") as handle:
            handle.write(" now complete\n")
        last = await receive_lines(socket, 1601)
        assert [(ln["line_no"], ln["text"]) for ln in last] == [(1601, "partial now complete")]
        await socket.disconnect()

    run(body)


def test_resume_message_and_query_send_only_lines_after_since_line(world, catalog):
    job = make_job(world.tenant)
    write_log(job, [f"line {n}" for n in range(1, 301)])
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        # Reconnected client announces what it has: no backfill, lines after 250 only.
        socket = communicator(f"/ws/jobs/{job.pk}/", cookie=cookie)
        assert (await socket.connect(timeout=TIMEOUT))[0]
        await socket.send_json_to({"type": "resume", "since_line": 250})
        lines = await receive_lines(socket, 300)
        assert_contiguous(lines, 251, 300)
        write_log(job, ["line 301"])
        assert_contiguous(await receive_lines(socket, 301), 301, 301)
        await socket.disconnect()

        # The same through the URL.
        socket = communicator(f"/ws/jobs/{job.pk}/?since_line=298", cookie=cookie)
        assert (await socket.connect(timeout=TIMEOUT))[0]
        assert_contiguous(await receive_lines(socket, 301), 299, 301)
        await socket.disconnect()

    run(body)


def test_several_viewers_share_one_follower_and_each_get_every_line(world, catalog):
    job = make_job(world.tenant)
    write_log(job, ["first"])
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        sockets = [communicator(f"/ws/jobs/{job.pk}/", cookie=cookie) for _ in range(3)]
        for socket in sockets:
            assert (await socket.connect(timeout=TIMEOUT))[0]
        for socket in sockets:
            assert_contiguous(await receive_lines(socket, 1), 1, 1)
        loop_id = id(asyncio.get_running_loop())
        assert [k for k in followers.followers if k == (loop_id, job.pk)]
        assert followers.viewers[(loop_id, job.pk)] == 3
        write_log(job, [f"more {n}" for n in range(2, 52)])
        for socket in sockets:
            assert_contiguous(await receive_lines(socket, 51), 2, 51)
        for socket in sockets:
            await socket.disconnect()
        assert (loop_id, job.pk) not in followers.followers

    run(body)


def test_secret_values_are_masked_in_streamed_lines(world, catalog):
    job = make_job(
        world.tenant,
        secret_env_encrypted=encrypt_json({"HF_TOKEN": "hf_abcdef123456", "PIN": "12"}),
        secret_env_names=["HF_TOKEN", "PIN"],
    )
    write_log(job, ["token is hf_abcdef123456 ok", "pin 12"])
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        socket = communicator(f"/ws/jobs/{job.pk}/", cookie=cookie)
        assert (await socket.connect(timeout=TIMEOUT))[0]
        backfill = await receive_lines(socket, 2)
        write_log(job, ["again: hf_abcdef123456hf_abcdef123456"])
        live = await receive_lines(socket, 3)
        await socket.disconnect()
        return backfill + live

    texts = [line["text"] for line in run(body)]
    assert texts == [
        "token is •••••• ok",
        "pin 12",  # too short to mask without blanking ordinary text
        "again: ••••••••••••",
    ]


def test_a_slow_readers_inbox_drops_log_batches_past_its_bound_and_fills_them_later():
    """The job socket and the API log stream share one bound: past MAX_QUEUED, log
    batches are dropped (other messages never are) and read from the store once the
    reader has caught up."""

    class Cursor:  # what LogInbox asks of a JobLogCursor
        last_sent = 0
        filled: list[int] = []

        async def fill_to(self, line: int) -> None:
            self.filled.append(line)
            self.last_sent = line

    inbox = consumers.LogInbox()
    for n in range(1, consumers.MAX_QUEUED + 6):
        inbox.put({"type": "log", "lines": [{"line_no": n, "text": f"line {n}"}]})
    inbox.put({"type": "status", "status": "running"})
    assert inbox.queue.qsize() == consumers.MAX_QUEUED + 1
    assert inbox.dropped_last_line == consumers.MAX_QUEUED + 5

    cursor = Cursor()
    async_to_sync(inbox.fill_dropped)(cursor)
    assert cursor.filled == []  # not while the reader is behind
    while not inbox.queue.empty():
        inbox.get_nowait()
    async_to_sync(inbox.fill_dropped)(cursor)
    async_to_sync(inbox.fill_dropped)(cursor)
    assert cursor.filled == [consumers.MAX_QUEUED + 5]


def test_a_slow_readers_inbox_holds_a_bounded_amount_of_log_text():
    """Few but large batches (a job flooding its log) are dropped past
    MAX_QUEUED_LOG_CHARS, however few messages wait; one larger than the bound still
    passes when nothing else waits."""
    inbox = consumers.LogInbox()
    third = consumers.MAX_QUEUED_LOG_CHARS // 3 + 1
    for n in (1, 2, 3, 4):
        inbox.put({"type": "log", "lines": [{"line_no": n, "text": "x" * third}]})
    assert inbox.queue.qsize() == 2 and inbox.dropped_last_line == 4
    assert inbox.queued_chars == 2 * third
    assert asyncio.run(inbox.get())["lines"][0]["line_no"] == 1
    assert inbox.get_nowait()["lines"][0]["line_no"] == 2 and inbox.queued_chars == 0
    huge = "y" * (consumers.MAX_QUEUED_LOG_CHARS + 1)
    inbox.put({"type": "log", "lines": [{"line_no": 5, "text": huge}]})
    inbox.put({"type": "log", "lines": [{"line_no": 6, "text": "z"}]})
    inbox.put({"type": "status", "status": "running"})  # never dropped
    assert [m.get("type") for m in (inbox.get_nowait(), inbox.get_nowait())] == ["log", "status"]
    assert inbox.dropped_last_line == 6 and inbox.queued_chars == 0
