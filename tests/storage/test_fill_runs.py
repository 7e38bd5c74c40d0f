"""Runs of a volume fill: a duplicate or redelivered message never restarts a copy under
way; the sweep starts a new run of a fill whose worker died (or whose message was
lost), and fails it after FILL_MAX_ATTEMPTS runs; a run that was superseded stops
without writing into the volume or recording its end. Through a real HTTP server on
127.0.0.1; the worker's task runs in-process (only the broker is left out)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection
from django.utils import timezone

from jobs.backends.local_volumes import volume_folder
from storage import services
from storage.fill_copy import STAGING_PREFIX
from storage.models import FillStatus, VolumeFill
from tests.broker import broker_replaced
from tests.conftest import signed_in_client, token_client
from tests.factories import VolumeFactory

PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes


class Handler(BaseHTTPRequestHandler):
    """/data.bin: PAYLOAD. /slow.bin: PAYLOAD, but the n-th request (from 0) sends 1,000
    bytes, says so in `arrived[n]` and waits for `release[n]` (a copy caught half-way)."""

    arrived = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]
    slow_requests = 0

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path not in ("/data.bin", "/slow.bin"):
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()
        self.wfile.write(PAYLOAD[:1000])
        self.wfile.flush()
        if self.path == "/slow.bin":
            n = Handler.slow_requests
            Handler.slow_requests += 1
            if n < len(Handler.arrived):
                Handler.arrived[n].set()
                Handler.release[n].wait(20)
        self.wfile.write(PAYLOAD[1000:])


@pytest.fixture(scope="module")
def http_base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    for event in Handler.release:
        event.set()
    server.shutdown()
    server.server_close()


def stale(fill: VolumeFill, **values) -> None:
    """Make the fill's last sign of life older than the sweep waits."""
    old = timezone.now() - timedelta(seconds=services.FILL_STALE_SECONDS + 1)
    VolumeFill.objects.filter(pk=fill.pk).update(touched_at=old, **values)


@pytest.mark.django_db
def test_a_duplicate_message_never_restarts_a_copy(world, catalog, fill_settings, http_base):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/data.bin"
    )
    # A worker took the message and is copying (run 1); the same message again (Redis
    # redelivers after its visibility timeout, a copy may take longer) is stale.
    VolumeFill.objects.filter(pk=fill.pk).update(status=FillStatus.RUNNING, attempt=1)
    services.volume_fill_run(fill_id=fill.pk, attempt=0)
    fill.refresh_from_db()
    assert (fill.status, fill.attempt, fill.bytes_done) == (FillStatus.RUNNING, 1, 0)
    assert not volume_folder(tenant_id=volume.tenant_id, volume_id=volume.pk).exists()
    # Once ended, no message restarts it either.
    VolumeFill.objects.filter(pk=fill.pk).update(status=FillStatus.QUEUED, attempt=0)
    services.volume_fill_run(fill_id=fill.pk, attempt=0)
    services.volume_fill_run(fill_id=fill.pk, attempt=0)
    fill.refresh_from_db()
    assert (fill.status, fill.attempt, fill.bytes_done) == ("succeeded", 1, len(PAYLOAD))


@pytest.mark.django_db
def test_the_sweep_restarts_a_fill_whose_worker_died(
    world, catalog, fill_settings, http_base, tasks_in_process
):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/data.bin"
    )
    folder = volume_folder(tenant_id=volume.tenant_id, volume_id=volume.pk)
    # Run 1 died half-way: its row says copying, its staging folder holds a part.
    dead = folder / f"{STAGING_PREFIX}{fill.pk}-1"
    dead.mkdir(parents=True)
    (dead / "data.bin").write_bytes(PAYLOAD[:500])
    VolumeFill.objects.filter(pk=fill.pk).update(
        status=FillStatus.RUNNING, attempt=1, bytes_done=500
    )
    assert services.volume_fills_sweep() == {"requeued": 0, "failed": 0}  # not stale yet
    stale(fill)
    assert services.volume_fills_sweep() == {"requeued": 1, "failed": 0}
    fill.refresh_from_db()
    assert (fill.status, fill.attempt, fill.bytes_done) == ("succeeded", 2, len(PAYLOAD))
    assert (folder / "data.bin").read_bytes() == PAYLOAD
    assert sorted(p.name for p in folder.iterdir()) == ["data.bin"]  # no staging left
    page = signed_in_client(world.member, world.tenant).get(f"/storage/{volume.pk}/")
    assert b"run 2: the copy started again after its worker stopped" in page.content
    api = token_client(world.member, world.tenant).get(f"/api/v1/volumes/{volume.pk}")
    assert api.json()["fill"]["attempt"] == 2
    assert services.volume_fills_sweep() == {"requeued": 0, "failed": 0}  # ended: left alone


@pytest.mark.django_db
def test_a_lost_message_is_queued_again_once_per_wait(world, catalog, fill_settings, settings):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source="http://127.0.0.1:9/lost.bin"
    )
    sent = []
    with pytest.MonkeyPatch.context() as patch:
        broker_replaced(patch, lambda task, args, countdown: sent.append((task.name, args)))
        stale(fill)
        assert services.volume_fills_sweep() == {"requeued": 1, "failed": 0}
        # Still queued behind busy workers a minute later: not queued a third time.
        assert services.volume_fills_sweep() == {"requeued": 0, "failed": 0}
    assert sent == [("storage.tasks.volume_fill_task", (fill.pk, 0))]
    fill.refresh_from_db()
    assert fill.status == FillStatus.QUEUED and fill.touched_at > timezone.now() - timedelta(
        minutes=1
    )


@pytest.mark.django_db
def test_a_fill_that_keeps_losing_its_worker_fails_saying_so(
    world, catalog, fill_settings, http_base
):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/data.bin"
    )
    stale(fill, status=FillStatus.RUNNING, attempt=services.FILL_MAX_ATTEMPTS)
    assert services.volume_fills_sweep() == {"requeued": 0, "failed": 1}
    fill.refresh_from_db()
    assert fill.status == FillStatus.FAILED and fill.finished_at is not None
    assert f"stopped {services.FILL_MAX_ATTEMPTS} times" in fill.error
    assert "start the fill again" in fill.error


def in_thread(action) -> tuple[threading.Thread, list[BaseException]]:
    """Start `action` in a thread of its own (its own database connection, as a second
    worker has); errors are kept for the test to look at."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


@pytest.mark.django_db(transaction=True)
def test_a_superseded_run_stops_without_touching_the_newer_one(
    world, catalog, fill_settings, http_base, monkeypatch
):
    Handler.slow_requests = 0
    for event in Handler.arrived + Handler.release:
        event.clear()
    volume = VolumeFactory(tenant=world.tenant, name="data")
    queued = []
    broker_replaced(monkeypatch, lambda task, args, countdown: queued.append(args))
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/slow.bin"
    )
    assert queued == [(fill.pk, 0)]
    # From now on queued messages run at once where they were sent, as a worker would.
    broker_replaced(monkeypatch, lambda task, args, countdown: task.apply(args=args, throw=True))
    folder = volume_folder(tenant_id=volume.tenant_id, volume_id=volume.pk)

    def sweep_until_it_takes_over() -> None:
        # Run 1 may report its first bytes after being made stale (a sign of life):
        # then the sweep waits, and is asked again.
        deadline = time.monotonic() + 10
        while True:
            stale(fill)
            if services.volume_fills_sweep() == {"requeued": 1, "failed": 0}:
                return
            assert time.monotonic() < deadline, "the sweep never took over the fill"
            time.sleep(0.2)

    run_1, errors_1 = in_thread(lambda: services.volume_fill_run(fill_id=fill.pk, attempt=0))
    try:
        assert Handler.arrived[0].wait(20), "run 1 never asked for the file"
        # Run 1 looks dead to the sweep (a worker stuck for longer than the wait): run 2
        # starts, in a second worker, and is caught half-way too.
        run_2, errors_2 = in_thread(sweep_until_it_takes_over)
        assert Handler.arrived[1].wait(20), "run 2 never asked for the file"
        staging_2 = folder / f"{STAGING_PREFIX}{fill.pk}-2"
        deadline = time.monotonic() + 10
        while not staging_2.exists():  # the request goes out before the copy starts
            assert time.monotonic() < deadline, "run 2 never started copying"
            time.sleep(0.05)
        # Run 1 goes on: at its next report it finds it was superseded, and stops
        # without ending the fill or removing run 2's staging folder.
        Handler.release[0].set()
        run_1.join(30)
        assert not run_1.is_alive() and not errors_1
        during = VolumeFill.objects.get(pk=fill.pk)
        assert (during.status, during.attempt, during.error) == ("running", 2, "")
        assert during.bytes_done <= 1000 and during.files_done == 0  # run 2's, not run 1's
        assert during.finished_at is None
        assert [p.name for p in folder.iterdir()] == [staging_2.name]
    finally:
        for event in Handler.release:
            event.set()
    run_2.join(30)
    assert not run_2.is_alive() and not errors_2
    ended = VolumeFill.objects.get(pk=fill.pk)
    assert (ended.status, ended.attempt, ended.bytes_done) == ("succeeded", 2, len(PAYLOAD))
    assert (folder / "slow.bin").read_bytes() == PAYLOAD  # run 2's copy, whole
    assert sorted(p.name for p in folder.iterdir()) == ["slow.bin"]
