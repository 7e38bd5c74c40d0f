"""Job log store: numbering and range reads (also of huge files), masking, the archive,
the Kubernetes spool, the follower lease, the download and log APIs, and a real local
job's output end to end through the store."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gzip
import io
import json
import random
import shutil
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers, get_channel_layer
from django.db.backends.signals import connection_created
from django.urls import include, path, re_path

from console.crypto import encrypt_json
from jobs import realtime, services
from jobs.api import streams
from jobs.backends import get_backend
from jobs.backends.base import LogSource
from jobs.backends.local import LocalBackend
from jobs.backends.local_logs import LocalLogStream
from jobs.logs import archive as log_archive
from jobs.logs import follower as log_follower
from jobs.logs import leases, reading
from jobs.logs.stores import FileLog, LogSpool, spool_dir
from jobs.models import Job, JobLogArchive, JobStatus
from sandbox.kubesim import PodRun
from tests.conftest import signed_in_client, streamed_chunks
from tests.jobs.test_consumers import forget_files, make_job, write_log
from tests.jobs.test_kubernetes_lifecycle import (
    cluster,  # noqa: F401 (fixture)
    gpu_spec,
    ns,
    settle,
)
from tests.jobs.test_local_lifecycle import spec, wait_for_status
from tests.jobs_helpers import launch as launch_on_cluster

# The routes the lead adds to jobs/api/urls.py, so these tests run before and after.
urlpatterns = [
    re_path(r"^api/v1/jobs/(?P<pk>\d+)/logs/download/?$", streams.JobLogDownloadView.as_view()),
    re_path(r"^api/v1/jobs/(?P<pk>\d+)/metrics/?$", streams.JobMetricsView.as_view()),
    re_path(r"^api/v1/jobs/(?P<pk>\d+)/monitor/?$", streams.JobMonitorView.as_view()),
    path("", include("console.urls")),
]


def texts(lines) -> list[str]:
    return [line.text for line in lines]


# --- the file store ------------------------------------------------------------------------------


def test_range_reads_match_a_plain_scan_on_a_large_growing_file(tmp_path):
    path = tmp_path / "output.log"
    rng = random.Random(5)
    expected = [f"{n} " + "x" * rng.randrange(0, 300) for n in range(1, 25001)]
    path.write_text("\n".join(expected[:12000]) + "\n")
    store = FileLog(path)
    assert store.count() == 12000
    with path.open("a") as handle:  # grows after the first index
        handle.write("\n".join(expected[12000:]) + "\n")
    assert store.count() == 25000
    for since in [0, 1, 1023, 1024, 1025, 4096, 12000, 24990, 25000, 30000]:
        got = store.read(since, 50)
        assert [ln.line_no for ln in got] == list(range(since + 1, min(since + 50, 25000) + 1))
        assert texts(got) == expected[since : since + 50]
    assert all(ln.rank == 0 for ln in store.read(0, 10))


def test_a_line_being_written_gets_its_number_once_complete(tmp_path):
    path = tmp_path / "output.log"
    path.write_text("one\ntwo\nthr")
    store = FileLog(path)
    assert store.count() == 2 and texts(store.read(0, 10)) == ["one", "two"]
    assert store.count(final=True) == 3  # the job ended: the last line counts as is
    assert texts(store.read(2, 10, final=True)) == ["thr"]
    with path.open("a") as handle:
        handle.write("ee\n")
    assert texts(store.read(2, 10)) == ["three"]


def test_a_very_long_line_is_cut_into_64k_pieces(tmp_path):
    path = tmp_path / "output.log"
    long_line = "y" * (3 * 2**20)
    path.write_text(f"a\n{long_line}\nb\n")
    store = FileLog(path)
    assert store.count() == 50  # 3 MiB = 48 pieces of 64 KiB, between two short lines
    lengths: list[int] = []
    while page := texts(store.read(len(lengths), 100)):  # pages hold about 1 MiB
        lengths += [len(t) for t in page]
    assert lengths == [1] + [65536] * 48 + [1]


def test_a_million_lines_range_read_seeks_instead_of_scanning(tmp_path, monkeypatch):
    path = tmp_path / "output.log"
    with path.open("w") as handle:
        handle.writelines(f"step {n} loss={1 / n:.6f}\n" for n in range(1, 1_000_001))
    store = FileLog(path)
    assert store.count() == 1_000_000  # builds the index once

    bytes_read: list[int] = []

    class Counting(io.FileIO):
        def readinto(self, buffer):  # what BufferedReader calls
            count = super().readinto(buffer)
            bytes_read.append(count or 0)
            return count

    def counting_open(file, mode="r", *args, **kwargs):
        assert mode == "rb"
        return io.BufferedReader(Counting(file, "r"))

    monkeypatch.setattr("jobs.logs.stores.open", counting_open, raising=False)
    chunk = FileLog._indexes[str(path)].chunk
    for since in range(0, 1_000_000, 99_991):
        bytes_read.clear()
        assert store.read(since, 200)[0].text.startswith(f"step {since + 1} ")
        # A scan from the start would read up to the whole 25 MB file; a seek to the
        # indexed block reads one chunk (two where the block straddles a chunk's end).
        assert sum(bytes_read) <= 2 * chunk + io.DEFAULT_BUFFER_SIZE, (since, sum(bytes_read))
    assert path.stat().st_size > 10 * chunk


# --- job-level reads: masking, API ---------------------------------------------------------------


@pytest.mark.django_db
def test_read_lines_masks_secrets_and_pages_by_number(world, catalog):
    job = make_job(
        world.tenant,
        secret_env_encrypted=encrypt_json({"WANDB_API_KEY": "wandb-s3cret-value"}),
        secret_env_names=["WANDB_API_KEY"],
    )
    write_log(job, ["start", "key=wandb-s3cret-value", *[f"l{n}" for n in range(3, 11)]])
    page = reading.read_lines(job, since_line=1, limit=3)
    assert [(ln["line_no"], ln["text"]) for ln in page["lines"]] == [
        (2, "key=••••••"),
        (3, "l3"),
        (4, "l4"),
    ]
    assert page["next_line"] == 4 and page["lines"][0]["ts"] and page["lines"][0]["rank"] == 0
    assert reading.read_lines(job, since_line=10)["lines"] == []
    assert reading.read_lines(job, since_line=10)["next_line"] == 10
    lines, last = reading.tail_lines(job, 3)
    assert [ln["line_no"] for ln in lines] == [8, 9, 10] and last == 10


@pytest.mark.django_db
@pytest.mark.urls("tests.jobs.test_logstream")
def test_download_is_the_whole_masked_log_and_tenant_scoped(world, other_world, catalog):
    job = make_job(
        world.tenant,
        nodes=1,
        secret_env_encrypted=encrypt_json({"HF_TOKEN": "hf_0123456789"}),
        secret_env_names=["HF_TOKEN"],
    )
    write_log(job, [f"line {n} hf_0123456789" for n in range(1, 5001)])
    client = signed_in_client(world.viewer, world.tenant)
    response = client.get(f"/api/v1/jobs/{job.pk}/logs/download")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="job-{job.pk}.log"'
    body = b"".join(streamed_chunks(response)).decode()
    assert body.splitlines()[0] == "line 1 ••••••" and len(body.splitlines()) == 5000
    assert "hf_0123456789" not in body
    outsider = signed_in_client(other_world.owner, other_world.tenant)
    assert outsider.get(f"/api/v1/jobs/{job.pk}/logs/download").status_code == 404


@pytest.mark.django_db
def test_multi_node_download_prefixes_ranks(world, catalog, monkeypatch):
    job = make_job(world.tenant, backend="kubernetes", nodes=2, status=JobStatus.SUCCEEDED)
    spool = LogSpool(spool_dir(job))
    spool.append(1, [(pod("p0", 0), 0, ["a0"]), (pod("p1", 1), 0, ["b0", "b1"])])
    # The job's pods are gone (no cluster here): the spool is what was read.
    monkeypatch.setattr(reading, "spool_sync", lambda job, backend: 0)
    body = b"".join(reading.download_chunks(job)).decode()
    assert body == "[0] a0\n[1] b0\n[1] b1\n"


# --- kubernetes spool ----------------------------------------------------------------------------


def pod(key: str, rank: int, live: bool = True) -> LogSource:
    return LogSource(rank=rank, key=key, live=live)


def test_spool_appends_only_what_each_pod_printed_since_the_last_read(tmp_path):
    spool = LogSpool(tmp_path / "spool")
    r0, r1 = pod("job-0-a/uid0", 0), pod("job-1-b/uid1", 1)
    assert spool.append(1, [(r0, 0, ["r0 a"]), (r1, 0, ["r1 a", "r1 b"])]) == 3
    # A whole log read again, and a follow stream's suffix: only the new lines count.
    assert spool.append(1, [(r0, 0, ["r0 a", "r0 b"]), (r1, 2, [])]) == 1
    assert spool.append(1, [(r1, 1, ["r1 b", "r1 c"])]) == 1
    assert spool.append(1, [(r1, 5, ["too far"])]) == 0  # a gap: never appended
    # A pod replacing rank 0 (a resume, a new attempt) starts its log over.
    assert spool.append(2, [(pod("job-0-c/uid2", 0), 0, ["again"])]) == 1
    assert spool.counts() == {"job-0-a/uid0": 2, "job-1-b/uid1": 3, "job-0-c/uid2": 1}
    lines = spool.read(0, 100)
    assert [(ln.line_no, ln.rank, ln.text) for ln in lines] == [
        (1, 0, "r0 a"),
        (2, 1, "r1 a"),
        (3, 1, "r1 b"),
        (4, 0, "r0 b"),
        (5, 1, "r1 c"),
        (6, 0, "again"),
    ]
    assert spool.count() == 6 and [ln.line_no for ln in spool.read(4, 10)] == [5, 6]


# --- archive -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_finished_jobs_logs_are_archived_once_and_stay_readable(world, catalog):
    running = make_job(world.tenant, name="still running")
    write_log(running, ["r"])
    job = make_job(
        world.tenant,
        status=JobStatus.SUCCEEDED,
        secret_env_encrypted=encrypt_json({"TOKEN": "tok-123456"}),
        secret_env_names=["TOKEN"],
    )
    path = write_log(job, [f"line {n}" for n in range(1, 2001)] + ["TOKEN tok-123456"])
    with path.open("a") as handle:
        handle.write("no newline at the end")
    assert log_archive.logs_archive_finished() == 1
    assert log_archive.logs_archive_finished() == 0  # idempotent; running jobs untouched
    archive = JobLogArchive.objects.get(job=job)
    assert archive.lines == 2002 and Path(archive.path).exists()
    with gzip.open(archive.path, "rt") as handle:
        stored = [json.loads(row) for row in handle]
    assert stored[-2] == [0, "TOKEN ••••••"] and stored[-1] == [0, "no newline at the end"]
    before = reading.read_lines(job, since_line=1990, limit=20)["lines"]
    path.unlink()  # the run directory is gone (pods deleted, host cleaned)
    after = reading.read_lines(job, since_line=1990, limit=20)["lines"]
    assert [(ln["line_no"], ln["text"]) for ln in after] == [
        (ln["line_no"], ln["text"]) for ln in before
    ]
    assert not JobLogArchive.objects.filter(job=running).exists()


def test_archive_range_reads_cross_member_boundaries(tmp_path):
    per = log_archive.ARCHIVE_MEMBER_LINES
    total = 3 * per + 5
    rows = [(n % 3, f"line {n} ünï") for n in range(1, total + 1)]
    target = tmp_path / "job-1.jsonl.gz"
    assert log_archive.write_archive(target, iter(rows)) == total
    store = log_archive.ArchiveLog(target)
    assert store.count() == total
    for since, limit in [
        (0, 10),
        (per - 1, 2),  # the last line of a member and the first of the next
        (per, 1),
        (per + 1, 5),
        (2 * per - 3, 10),
        (10, 2 * per + 50),  # spans three members
        (3 * per, 100),  # the last, short member
        (total - 3, 10),  # the last page is short
        (total, 10),  # beyond the end
        (total + 500, 10),
    ]:
        got = store.read(since, limit)
        expected = list(range(since + 1, min(since + limit, total) + 1))
        assert [ln.line_no for ln in got] == expected, (since, limit)
        assert [(ln.rank, ln.text) for ln in got] == [rows[n - 1] for n in expected]
    # Still one ordinary gzip file for any other reader (e.g. zcat on a download).
    with gzip.open(target, "rt", encoding="utf-8") as handle:
        assert [tuple(json.loads(row)) for row in handle] == rows


def test_archives_without_a_matching_index_are_read_whole(tmp_path):
    rows = [[0, f"old {n}"] for n in range(1, 2501)]
    legacy = tmp_path / "job-2.jsonl.gz"  # the format before the index: one gzip stream
    with gzip.open(legacy, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    store = log_archive.ArchiveLog(legacy)
    assert store.count() == 2500
    assert [ln.text for ln in store.read(2047, 3)] == ["old 2048", "old 2049", "old 2050"]
    # An index left from another write of the archive (torn replace) is not trusted.
    indexed = tmp_path / "job-3.jsonl.gz"
    log_archive.write_archive(indexed, [(0, "stale")] * 5000)
    shutil.copy(legacy, indexed)
    store = log_archive.ArchiveLog(indexed)
    assert store.count() == 2500 and store.read(2499, 5)[0].text == "old 2500"
    empty = tmp_path / "job-4.jsonl.gz"
    assert log_archive.write_archive(empty, []) == 0
    empty_store = log_archive.ArchiveLog(empty)
    assert empty_store.count() == 0 and empty_store.read(0, 5) == []


# --- the follower's lease ------------------------------------------------------------------------


def test_one_follower_holds_the_lease_and_another_takes_over():
    async def body():
        first, second = log_follower.LogFollower(424242), log_follower.LogFollower(424242)
        client = leases.redis_clients.get()
        await client.delete(first.lease_key)
        try:
            assert await first._hold_lease(client)
            first.holding = True
            assert not await second._hold_lease(client)
            assert await first._hold_lease(client)  # renewing is holding
            await first.release()
            assert await second._hold_lease(client)
            second.holding = True
            await first.release()  # not the holder: leaves the lease alone
            assert await client.get(first.lease_key) == second.token.encode()
        finally:
            await second.release()
            await log_follower.close_for_loop()

    async_to_sync(body)()


# --- a real local job ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_real_local_job_output_is_numbered_masked_and_archived(world, catalog):
    program = (
        "import os\n"
        "for n in range(1, 301):\n"
        "    print(f'step {n} loss={1 / n:.4f}')\n"
        "print('token', os.environ['API_TOKEN'])\n"
        "print('done', end='')\n"
    )
    job = services.job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=spec(["python", "-c", program], secret_env={"API_TOKEN": "sekrit-9876"}),
    )
    forget_files(job)
    job = services.job_dispatch(job=job)
    job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert job.status == JobStatus.SUCCEEDED
    lines = reading.read_lines(job, since_line=295, limit=100)["lines"]
    assert [(ln["line_no"], ln["text"]) for ln in lines] == [
        (296, "step 296 loss=0.0034"),
        (297, "step 297 loss=0.0034"),
        (298, "step 298 loss=0.0034"),
        (299, "step 299 loss=0.0033"),
        (300, "step 300 loss=0.0033"),
        (301, "token ••••••"),
        (302, "done"),
    ]
    # The backend's own numbering agrees (the API's range reads and the stream match).
    assert [ln.line_no for ln in LocalBackend().logs(job, since_line=295)] == list(range(296, 303))
    assert log_archive.job_log_archive(job=Job.objects.get(pk=job.pk)) is not None
    assert JobLogArchive.objects.get(job=job).lines == 302


# --- kubernetes pods, through the test API server ------------------------------------------------


def test_kubernetes_job_logs_get_stable_numbers_and_outlive_the_pods(world, cluster):  # noqa: F811
    def script(pod: dict) -> PodRun:
        rank = int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
        rank += int(pod["metadata"]["annotations"]["gpugeek.io/rank-offset"])
        return PodRun(logs=[f"rank {rank} a", f"rank {rank} b"], duration=0.3)

    cluster.pod_script = script
    job = launch_on_cluster(world, gpu_spec(nodes=2, spot_ratio=Decimal("0.5")))
    forget_files(job)
    job = settle(cluster, job, JobStatus.RUNNING)
    first = reading.read_lines(job)["lines"]
    assert [(ln["line_no"], ln["rank"], ln["text"]) for ln in first] == [
        (1, 0, "rank 0 a"),
        (2, 0, "rank 0 b"),
        (3, 1, "rank 1 a"),
        (4, 1, "rank 1 b"),
    ]
    assert reading.read_lines(job, since_line=4)["lines"] == []  # read again: no repeats
    job = settle(cluster, job, JobStatus.SUCCEEDED)
    assert log_archive.job_log_archive(job=job) is not None
    for pod in cluster.list("pods", ns(job)):
        cluster.delete("pods", ns(job), pod["metadata"]["name"])
    shutil.rmtree(spool_dir(job))
    again = reading.read_lines(job)["lines"]
    assert [(ln["line_no"], ln["rank"], ln["text"]) for ln in again] == [
        (ln["line_no"], ln["rank"], ln["text"]) for ln in first
    ]


def test_pod_log_streams_skip_follow_and_end_with_the_container(world, cluster):  # noqa: F811
    cluster.pod_script = lambda pod: PodRun(logs=["a", "b", "c"], duration=None)
    job = launch_on_cluster(world, gpu_spec(nodes=1))
    job = settle(cluster, job, JobStatus.RUNNING)
    backend = get_backend("kubernetes")
    (source,) = backend.log_sources(job)
    assert (source.rank, source.live) == (0, True)
    snapshot = backend.open_log(job, source, skip=1, follow=False)
    assert snapshot.poll() == ["b", "c"] and snapshot.ended
    stream = backend.open_log(job, source, skip=2)
    try:
        (pod_name,) = [p["metadata"]["name"] for p in cluster.list("pods", ns(job))]
        cluster.append_log(ns(job), pod_name, "d\ne")
        got: list[str] = []
        deadline = time.monotonic() + 15
        while len(got) < 3 and time.monotonic() < deadline:
            got += stream.poll()
            time.sleep(0.02)
        assert got == ["c", "d", "e"] and not stream.ended
        cluster.delete("pods", ns(job), pod_name)  # the pod goes: its stream ends
        while not stream.ended and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stream.ended and stream.poll() == []
    finally:
        stream.close()


# Committed: the follower reads the job from a thread of its own, on its own connection.
@pytest.mark.django_db(transaction=True)
def test_kubernetes_follower_streams_each_pod_once_for_all_viewers(world, cluster):  # noqa: F811
    cluster.pod_script = lambda pod: PodRun(logs=["started"], duration=None)
    job = launch_on_cluster(world, gpu_spec(nodes=2, spot_ratio=Decimal("0.5")))
    forget_files(job)
    job = settle(cluster, job, JobStatus.RUNNING)
    pods = {
        int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
        + int(p["metadata"]["annotations"]["gpugeek.io/rank-offset"]): p["metadata"]["name"]
        for p in cluster.list("pods", ns(job))
    }
    assert sorted(pods) == [0, 1]

    def log_requests(follow: bool) -> list:
        return [
            r
            for r in cluster.requests
            if r.path.endswith("/log") and (r.query.get("follow") == "true") == follow
        ]

    def readers_alive() -> list[str]:
        names = {f"pod-log-{name}" for name in pods.values()}
        return [t.name for t in threading.enumerate() if t.name in names]

    async def until(predicate, what: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.05)

    async def body():
        group = realtime.job_group(job.pk)
        received: list[dict] = []
        await realtime.hub().subscribe(group, received.append)
        client = leases.redis_clients.get()
        follower = log_follower.LogFollower(job.pk)
        await client.delete(follower.viewers_key, follower.lease_key, follower.cursor_key)
        try:
            log_follower.followers.watch(job.pk)  # two viewers, one upstream follower
            log_follower.followers.watch(job.pk)

            def lines() -> list[tuple[int, int, str]]:
                return [
                    (ln["line_no"], ln["rank"], ln["text"])
                    for m in received
                    for ln in m.get("lines") or ()
                ]

            await until(lambda: len(readers_alive()) == 2, "a stream per pod")
            for n in range(1, 4):
                cluster.append_log(ns(job), pods[0], f"rank 0 step {n}")
                cluster.append_log(ns(job), pods[1], f"rank 1 step {n}")
                await asyncio.sleep(0.05)
            await until(lambda: len(lines()) >= 8, "live lines")
            got = lines()
            # Numbered once, in arrival order across ranks, in print order within each.
            assert [n for n, _, _ in got] == list(range(1, 9))
            for rank in (0, 1):
                assert [t for _, r, t in got if r == rank] == ["started"] + [
                    f"rank {rank} step {n}" for n in (1, 2, 3)
                ]
            stored = await asyncio.to_thread(reading.read_lines, job, limit=100)
            assert [(ln["line_no"], ln["rank"], ln["text"]) for ln in stored["lines"]] == got
            assert len(log_requests(follow=True)) == 2  # one follow per pod
            assert log_requests(follow=False) == []  # no re-reads while followed
            await log_follower.followers.unwatch(job.pk)
            assert readers_alive()  # one viewer left: still following
            await log_follower.followers.unwatch(job.pk)
            await until(lambda: not readers_alive(), "streams closed with the last viewer")
        finally:
            await log_follower.close_for_loop()
            await realtime.close_hub()

    async_to_sync(body)()


# --- the follower: tail reading, local or Redis delivery -----------------------------------------


def test_local_log_stream_numbers_lines_like_the_store(tmp_path):
    path = tmp_path / "output.log"
    path.write_text("one\ntwo\n")
    source = LogSource(rank=0, key="output.log", live=True)
    stream = LocalLogStream(tmp_path, source, skip=1)
    with path.open("a") as handle:
        handle.write("three\nfo")
    assert stream.poll() == ["two", "three"]
    with path.open("a") as handle:
        handle.write("ur\n\nsix")
    assert stream.poll() == ["four", ""]
    assert stream.poll() == []  # "six" may still grow
    (tmp_path / "exit_code").write_text("0")
    assert stream.poll() == ["six"] and not stream.ended  # a resumed job writes on
    stream.close()
    stored = FileLog(path).read(0, 10, final=True)
    assert [ln.text for ln in stored] == ["one", "two", "three", "four", "", "six"]
    # Skipping lines: across read chunks, and past what is written so far.
    big = tmp_path / "big"
    big.mkdir()
    (big / "output.log").write_text("".join(f"{n}\n" for n in range(1, 300_001)) + "3000")
    assert LocalLogStream(big, source, skip=299_998, follow=False).poll() == ["299999", "300000"]
    ahead = LocalLogStream(big, source, skip=300_002)
    assert ahead.poll() == []
    with (big / "output.log").open("a") as handle:
        handle.write("01\nx\ny\n")
    assert ahead.poll() == ["y"]  # 300001 and x skipped
    ahead.close()


def every_threads_stack() -> str:
    with tempfile.TemporaryFile("w+") as out:
        faulthandler.dump_traceback(out, all_threads=True)
        out.seek(0)
        return out.read()


@contextlib.asynccontextmanager
async def following(job: Job):
    """A follower of `job` running in this event loop (this process its only viewer),
    stopped and its loop's hub closed on the way out."""
    follower = log_follower.LogFollower(job.pk, process_id="this-process")
    client = leases.redis_clients.get()
    await client.delete(follower.viewers_key, follower.lease_key, follower.cursor_key)
    follower.task = asyncio.ensure_future(follower.run())
    try:
        yield follower
    finally:
        follower.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower.task
        await follower.release()
        await log_follower.close_for_loop()
        await realtime.close_hub()


@pytest.mark.django_db(transaction=True)
def test_follower_uses_redis_only_while_another_process_has_viewers(world, catalog):
    job = make_job(world.tenant)
    write_log(job, ["line 1"])
    channel_layers.backends.clear()

    async def drain(layer, channel) -> list[dict]:
        messages = []
        while True:
            try:
                messages.append(await asyncio.wait_for(layer.receive(channel), 0.2))
            except TimeoutError:
                return messages

    async def body():
        layer = get_channel_layer()
        group = realtime.job_group(job.pk)
        probe = await layer.new_channel()  # what another process's hub would receive
        await layer.group_add(group, probe)
        local: list[dict] = []
        await realtime.hub().subscribe(group, local.append)
        async with following(job) as follower:
            client = leases.redis_clients.get()
            await asyncio.sleep(0.5)
            write_log(job, ["line 2"])
            await asyncio.sleep(0.5)
            assert [ln["line_no"] for m in local for ln in m["lines"]] == [2]
            through_redis = [m["payload"] for m in await drain(layer, probe)]
            assert all(not m["lines"] for m in through_redis)  # markers only
            # A viewer in another process: batches go through the group from now on.
            await client.hset(follower.viewers_key, "other-process", time.time())
            await asyncio.sleep(1.3)
            write_log(job, ["line 3"])
            await asyncio.sleep(0.5)
            through_redis = [m["payload"] for m in await drain(layer, probe)]
            assert [ln["line_no"] for m in through_redis for ln in m["lines"]] == [3]
            assert any(m.get("last_line") == 2 and not m["lines"] for m in through_redis)

    async_to_sync(body)()


@pytest.mark.django_db(transaction=True)
def test_the_followers_reads_give_their_connection_back(world, catalog):
    """Run as under an ASGI server (an event loop with no sync thread above it): the
    follower's database reads close what they opened, so none holds a pooled connection
    or keeps one a database restart has broken."""
    job = make_job(world.tenant)
    write_log(job, ["line 1"])
    channel_layers.backends.clear()
    opened: list = []

    def note(sender, connection, **kwargs) -> None:
        if threading.current_thread() is not threading.main_thread():
            opened.append(connection)

    async def body():
        async with following(job) as follower:
            deadline = time.monotonic() + 10
            while follower.cursor is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert follower.cursor == 1  # it has read the job and its log's length

    connection_created.connect(note)
    try:
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                asyncio.run(body())
            except BaseException as error:  # reported in the test's thread
                failure.append(error)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        server.join(90)
    finally:
        connection_created.disconnect(note)
    # A loaded CI host once kept it past 30 s: if it ever hangs, the stacks say where.
    assert not server.is_alive(), every_threads_stack()
    assert not failure, failure
    assert opened  # the reads ran in worker threads, on connections of their own
    assert [wrapper for wrapper in opened if wrapper.connection is not None] == []
