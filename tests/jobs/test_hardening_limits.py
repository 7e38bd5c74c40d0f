"""Issue 13 §2 limits: an API request body over DATA_UPLOAD_MAX_MEMORY_SIZE is refused
with 413 before anything parses it, signed in or not."""

from __future__ import annotations

import asyncio
import gzip
import json
import tracemalloc

import pytest
from django.core.handlers.asgi import ASGIHandler
from django.test import Client

from jobs import services
from jobs.backends import get_backend
from jobs.backends.base import LogSource
from jobs.backends.kubernetes.podlogs import PodLogStream
from jobs.backends.local_logs import LocalLogStream
from jobs.logs import archive as log_archive
from jobs.logs import reading
from jobs.logs.lines import LineSplitter, split_pieces
from jobs.logs.stores import FileLog, LogSpool
from jobs.models import Job, JobStatus
from tests.conftest import streamed_chunks, token_client
from tests.jobs.test_consumers import forget_files
from tests.jobs.test_local_lifecycle import spec, wait_for_status

OVERSIZED = 4096


@pytest.fixture
def small_limit(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = OVERSIZED


def big_json() -> str:
    return json.dumps({"username": "x", "password": "y" * (OVERSIZED * 2)})


@pytest.mark.django_db
def test_unauthenticated_token_endpoint_refuses_a_huge_body(small_limit):
    response = Client().post("/api/v1/auth/token", big_json(), content_type="application/json")
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


@pytest.mark.django_db
def test_authenticated_job_launch_refuses_a_huge_body(world, catalog, small_limit):
    api = token_client(world.member, world.tenant)
    response = api.post("/api/v1/jobs", big_json(), content_type="application/json")
    assert response.status_code == 413
    assert response.json() == {
        "detail": f"The request body is larger than {OVERSIZED} bytes.",
        "code": "payload_too_large",
    }


@pytest.mark.django_db(transaction=True)
def test_a_chunked_body_is_read_only_up_to_the_limit(small_limit):
    """Over ASGI a chunked body has no Content-Length: it is read up to limit + 1 bytes,
    then refused (WSGI servers hand Django no body without a length at all)."""
    body = big_json().encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/v1/auth/token",
        "raw_path": b"/api/v1/auth/token",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"transfer-encoding", b"chunked"),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    chunks = [body[i : i + 1024] for i in range(0, len(body), 1024)]
    messages = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[dict] = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected until answered

    async def send(message):
        sent.append(message)

    asyncio.run(ASGIHandler()(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 413


@pytest.mark.django_db
def test_a_body_within_the_limit_is_parsed_as_before(small_limit):
    response = Client().post(
        "/api/v1/auth/token",
        json.dumps({"username": "nobody@example.test", "password": "wrong"}),
        content_type="application/json",
    )
    assert response.status_code in (400, 401, 403)


# --- logs have limits: 64 KiB lines, a capped store, bounded reads ----------------------------

LINE = 65536
FIVE_MB = 5_000_000
FLOOD = "import sys; sys.stdout.write('x' * 5_000_000); sys.stdout.flush()"


def _run_local(world, command: list[str]):
    job = services.job_submit(tenant=world.tenant, user=world.member, spec=spec(command))
    forget_files(job)
    job = services.job_dispatch(job=job)
    job = wait_for_status(job, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert job.status == JobStatus.SUCCEEDED, job.status_reason
    return job


def _api_pages(api, job_id: int) -> list[dict]:
    lines, since = [], 0
    while True:
        response = api.get(f"/api/v1/jobs/{job_id}/logs", {"since_line": since, "limit": 5000})
        assert response.status_code == 200
        page = response.json()
        if not page["lines"]:
            return lines
        lines += page["lines"]
        since = page["next_line"]


def _peak_bytes(call) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_long_lines_are_cut_into_64k_pieces_on_character_boundaries():
    text = ("a" * 65535 + "é" * 40000 + "\n" + "b" * LINE + "\n" + "c" * (LINE + 1)).encode()
    pieces, ends = split_pieces(text, final=True)
    assert all(len(p) <= LINE for p in pieces)
    decoded = [p.decode() for p in pieces]  # no piece starts or ends inside a character
    assert "".join(decoded[:3]) == "a" * 65535 + "é" * 40000
    assert len(pieces[0]) == 65535  # "é" (2 bytes) would not fit: the cut moved back
    assert decoded[3] == "b" * LINE  # exactly 64 KiB, then its newline: one line
    assert decoded[4:] == ["c" * LINE, "c"] and ends[-1] == len(text)
    # Not final: the last short piece waits (it may still grow).
    assert [p.decode() for p in split_pieces(text)[0]] == decoded[:-1]
    # Fed in any parts, a stream gets the same pieces.
    splitter, fed = LineSplitter(), []
    for start in range(0, len(text), 7777):
        fed += splitter.feed(text[start : start + 7777])
    assert fed + splitter.finish() == pieces


def test_file_store_local_stream_and_pod_stream_number_long_lines_alike(tmp_path):
    body = b"one\n" + b"y" * (3 * LINE + 10) + b"\n" + "ü".encode() * 70000 + b"\nend"
    (tmp_path / "output.log").write_bytes(body)
    (tmp_path / "exit_code").write_text("0")
    stored = [line.text for line in FileLog(tmp_path / "output.log").read(0, 100, final=True)]
    assert len(stored) == 1 + 4 + 3 + 1 and max(map(len, stored)) <= LINE
    source = LogSource(rank=0, key="output.log", live=False)
    stream = LocalLogStream(tmp_path, source, follow=False)
    local = []
    while not stream.ended:
        local += stream.poll()
    assert local == stored
    assert LocalLogStream(tmp_path, source, skip=3, follow=False).poll() == stored[3:]

    class Response:  # the pod log API's streaming response (the Kubernetes edge)
        def __init__(self):
            self.parts = [body[i : i + 5000] for i in range(0, len(body), 5000)]

        def read1(self, size):
            return self.parts.pop(0) if self.parts else b""

        def close(self):
            pass

        def release_conn(self):
            pass

    class Core:
        def read_namespaced_pod_log(self, *args, **kwargs):
            return Response()

    pod = LogSource(rank=0, key="pod-0/uid", live=False)
    snapshot = PodLogStream(Core(), "ns", pod, follow=False)
    snapshot.start()
    assert snapshot.poll() == stored


@pytest.mark.django_db
def test_spool_splits_long_texts_and_stops_at_the_cap(tmp_path, settings):
    settings.JOB_LOG_MAX_BYTES = 300_000
    spool = LogSpool(tmp_path)
    pod = LogSource(rank=1, key="pod-1/uid", live=True)
    spool.append(1, [(pod, 0, ["short", "z" * (2 * LINE + 5)])])
    got = spool.read(0, 100)
    assert [len(line.text) for line in got] == [5, LINE, LINE, 5]
    assert [line.line_no for line in got] == [1, 2, 3, 4] and {ln.rank for ln in got} == {1}
    spool.append(1, [(pod, 2, ["w" * LINE] * 10)])  # far past the cap
    spool.append(1, [(pod, 12, ["later"])])
    got = spool.read(0, 100)
    assert got[-1].text == "[log truncated at 300000 bytes]"
    assert "later" not in [line.text for line in got]
    assert spool.counts() == {"pod-1/uid": 13}  # read on, so never read again
    assert spool.path.stat().st_size < 300_000 + 200


@pytest.mark.django_db(transaction=True)
def test_a_job_printing_5mb_without_a_newline_is_read_in_bounded_64k_lines(world, catalog):
    job = _run_local(world, ["python", "-c", FLOOD])
    api = token_client(world.member, world.tenant)
    lines = _api_pages(api, job.pk)
    assert [line["line_no"] for line in lines] == list(range(1, len(lines) + 1))
    assert max(len(line["text"]) for line in lines) == LINE
    assert sum(len(line["text"]) for line in lines) == FIVE_MB
    assert len(lines) == -(-FIVE_MB // LINE)  # 77
    # Each read (a page of the API, the socket backfill) holds about 1 MiB, not the line.
    page, peak = _peak_bytes(lambda: reading.read_lines(job, since_line=0, limit=5000))
    assert 0 < len(page["lines"]) < 20 and peak < 6 << 20, peak
    (tail, last), peak = _peak_bytes(lambda: reading.tail_lines(job))
    assert last == len(lines) and tail[-1]["line_no"] == last and peak < 6 << 20, peak
    assert sum(len(line["text"]) for line in tail) <= (1 << 20) + LINE
    # The archive: bounded members, read back alike.
    target = log_archive.job_log_archive(job=Job.objects.get(pk=job.pk))
    archived = log_archive.ArchiveLog(target)
    assert archived.count() == len(lines)
    got, peak = _peak_bytes(lambda: archived.read(40, 5000))
    assert got[0].line_no == 41 and len(got) < 20 and peak < 6 << 20, peak
    # The download streams pieces of about 1 MiB.
    download = api.get(f"/api/v1/jobs/{job.pk}/log.txt")
    assert download.status_code == 200
    chunks = streamed_chunks(download)
    assert max(map(len, chunks)) <= (1 << 20) + LINE + 1
    assert b"".join(chunks) == b"".join(b"x" * len(line["text"]) + b"\n" for line in lines)
    # The console keeps serving.
    assert api.get("/api/v1/jobs").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_log_past_job_log_max_bytes_ends_with_a_truncation_line(world, catalog, settings):
    settings.JOB_LOG_MAX_BYTES = 1_000_000
    job = _run_local(world, ["python", "-c", FLOOD])
    lines = _api_pages(token_client(world.member, world.tenant), job.pk)
    assert [line["line_no"] for line in lines] == list(range(1, 18))
    assert [len(line["text"]) for line in lines[:-1]] == [LINE] * 15 + [1_000_000 - 15 * LINE]
    assert lines[-1]["text"] == "[log truncated at 1000000 bytes]"
    assert reading.line_count(job) == 17
    # The supervisor stored no more than one byte past the cap of the 5 MB printed.
    assert get_backend(job.backend).log_path(job).stat().st_size == 1_000_001
    # The live stream numbers it alike.
    backend = get_backend(job.backend)
    (source,) = backend.log_sources(job)
    stream = backend.open_log(job, source, skip=14, follow=False)
    streamed = []
    while not stream.ended:
        streamed += stream.poll()
    assert streamed == [line["text"] for line in lines[14:]]
    target = log_archive.job_log_archive(job=Job.objects.get(pk=job.pk))
    assert [ln.text for ln in log_archive.ArchiveLog(target).read(15, 10)] == [
        line["text"] for line in lines[15:]
    ]


def test_an_unindexed_archive_is_indexed_in_bounded_steps_not_loaded(tmp_path):
    legacy = tmp_path / "job-9.jsonl.gz"  # before the index (and before lines were split)
    with gzip.open(legacy, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps([0, "first"]) + "\n")
        handle.write(json.dumps([0, "h" * (6 << 20)]) + "\n")
        handle.writelines(json.dumps([0, f"row {n}"]) + "\n" for n in range(3, 20001))
    store = log_archive.ArchiveLog(legacy)
    count, peak = _peak_bytes(store.count)
    assert count == 20000 and peak < 12 << 20, peak
    got, peak = _peak_bytes(lambda: store.read(0, 3))
    assert [ln.text for ln in got] == [
        "first",
        f"[a line of {(6 << 20) + 8} bytes is too long to show]",
        "row 3",
    ]
    assert store.read(19998, 5)[-1].text == "row 20000"
    # Rewritten, on its first read, as an indexed archive: later reads seek.
    assert log_archive.archive_index_path(legacy).exists()
    with gzip.open(legacy, "rt", encoding="utf-8") as handle:
        assert sum(1 for _ in handle) == 20000
    # New archives: a member holds about 1 MiB of text, however long its lines.
    indexed = tmp_path / "job-10.jsonl.gz"
    log_archive.write_archive(indexed, [(0, "k" * LINE)] * 100)
    index = json.loads(log_archive.archive_index_path(indexed).read_text())
    assert index["firsts"][:3] == [0, 16, 32] and index["lines"] == 100
    assert [ln.line_no for ln in log_archive.ArchiveLog(indexed).read(30, 3)] == [31, 32, 33]


def test_reads_of_a_32mb_unbroken_line_hold_a_bounded_window(tmp_path):
    path = tmp_path / "output.log"
    with path.open("wb") as handle:
        for _ in range(32):
            handle.write(b"q" * (1 << 20))
    store = FileLog(path)
    count, peak = _peak_bytes(lambda: store.count(final=True))
    assert count == 512 and peak < 6 << 20, peak  # indexing reads 1 MiB chunks
    page, peak = _peak_bytes(lambda: store.read(300, 5000, final=True))
    assert page[0].line_no == 301 and len(page) == 16 and peak < 6 << 20, peak
    stream = LocalLogStream(tmp_path, LogSource(rank=0, key="output.log", live=True), skip=500)
    polled, peak = _peak_bytes(stream.poll)
    assert len(polled) == 11 and peak < 12 << 20, peak  # 500 skipped; the last piece waits
    stream.close()
