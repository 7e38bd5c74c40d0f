"""Reading a job's log by range (API, backfill, gap filling, loss scans, downloads):
from the store its backend numbers itself, the spool, or the archive, masked."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

from jobs import realtime
from jobs.backends import get_backend
from jobs.logs.archive import ArchiveLog, archive_path
from jobs.logs.leases import followed
from jobs.logs.masking import SecretMasker, job_secret_values
from jobs.logs.stores import FileLog, LogSpool, LogStore, StoredLine, spool_dir, spool_sync
from jobs.models import Job
from jobs.realtime import LogLinePayload, parallel_db

BACKFILL_LINES = 1000
DOWNLOAD_CHUNK_CHARS = 1 << 20  # a download's pieces stay small, however long its lines


def store_for(job: Job, *, sync: bool = True) -> tuple[LogStore, bool]:
    """The store to read `job`'s lines from, and whether its last partial line counts.

    For a job whose lines are spooled and still on its backend, `sync` first appends what
    its sources printed since the last read, unless a follower keeps the spool current
    (it holds the job's lease)."""
    backend = get_backend(job.backend)
    own = backend.log_file(job)
    if own is not None:
        if own.path.exists():
            return FileLog(own.path), own.complete or job.is_finished
        empty = FileLog(own.path)
    else:
        spool = LogSpool(spool_dir(job))
        if not job.is_finished or not archive_path(job).exists():
            if sync and not followed(job.pk):
                spool_sync(job, backend)
            if spool.path.exists():
                return spool, True
        empty = FileLog(spool.path)
    archived = archive_path(job)
    if archived.exists():
        return ArchiveLog(archived), True
    return empty, True


def masked_payload(lines: list[StoredLine], masker: SecretMasker, ts: str) -> list[LogLinePayload]:
    return [
        LogLinePayload(line_no=ln.line_no, rank=ln.rank, text=masker(ln.text), ts=ts)
        for ln in lines
    ]


def read_lines(job: Job, *, since_line: int = 0, limit: int = 1000) -> dict:
    """`{"lines": [...], "next_line": N}` for lines after `since_line` (exclusive), masked.

    `next_line` is the number to pass as `since_line` for what follows."""
    store, final = store_for(job)
    lines = store.read(since_line, limit, final=final)
    payload = masked_payload(lines, SecretMasker(job_secret_values(job)), realtime.now_iso())
    return {"lines": payload, "next_line": lines[-1].line_no if lines else since_line}


def line_count(job: Job) -> int:
    store, final = store_for(job)
    return store.count(final=final)


def tail_lines(job: Job, count: int = BACKFILL_LINES) -> tuple[list[LogLinePayload], int]:
    """The last `count` lines (masked), and the number of the last one (0 if none)."""
    store, final = store_for(job)
    total = store.count(final=final)
    lines = store.read(max(0, total - count), count, final=final)
    while lines and lines[-1].line_no < total and count > 1:
        # A read stops at its byte budget: of long lines, fewer of the last ones fit.
        count = min(count - 1, len(lines))
        lines = store.read(max(0, total - count), count, final=final)
    last = lines[-1].line_no if lines else total
    return masked_payload(lines, SecretMasker(job_secret_values(job)), realtime.now_iso()), last


def iter_all_lines(job: Job, chunk: int = 5000) -> Iterator[StoredLine]:
    store, final = store_for(job)
    since = 0
    while True:
        lines = store.read(since, chunk, final=final)
        if not lines:
            return
        yield from lines
        since = lines[-1].line_no


def download_chunks(job: Job) -> Iterator[bytes]:
    """The whole log as text for download, masked; ranks prefixed on multi-node jobs."""
    masker = SecretMasker(job_secret_values(job))
    prefix = job.nodes > 1
    buffer: list[str] = []
    size = 0
    for line in iter_all_lines(job):
        text = masker(line.text)
        buffer.append(f"[{line.rank}] {text}\n" if prefix else f"{text}\n")
        size += len(text)
        if len(buffer) >= 2000 or size >= DOWNLOAD_CHUNK_CHARS:
            yield "".join(buffer).encode()
            buffer.clear()
            size = 0
    if buffer:
        yield "".join(buffer).encode()


async def adownload_chunks(job: Job) -> AsyncIterator[bytes]:
    """`download_chunks` for an ASGI response, each piece read (in a worker thread) only
    once the last one was sent: Django's ASGI handler reads a plain iterator to its end
    before sending a byte (a 300 MB log held whole), and the server's `send` returns
    when the client can take more (uvicorn's flow control), so a slow reader holds
    one piece, not the log."""
    chunks = download_chunks(job)
    read = parallel_db(next)
    try:
        while (chunk := await read(chunks, None)) is not None:
            yield chunk
    finally:
        # After a cancel the last read may still run in its thread ("generator already
        # executing"): it is then closed when collected.
        with contextlib.suppress(ValueError):
            chunks.close()
