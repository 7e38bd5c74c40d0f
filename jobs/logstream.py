"""Job logs: one numbered store per job, read by range, followed live, archived at the end.

Line numbers are 1-based and global per job. Where they come from:
- local backend: the job's `output.log` (rank 0), line n is the file's n-th line;
- kubernetes: a spool the console appends to as it reads the pods' logs (see
  `KubernetesSpool`), so lines of several ranks get one stable order (arrival order);
- once the job has finished, an archive (gzip members plus an index of their offsets,
  under LOG_ARCHIVE_DIR) keeps the log readable, by range, after its pods (or run
  directory) are gone.

Upstream reads go through the backend's log interface only (`log_sources`, `open_log`
in jobs.backends.base): the output file of a local job, the pod log API of a Kubernetes
job (one `follow=True` stream per pod while the job is followed, a one-off read of each
pod's log for an API read nobody follows).

Only complete lines are numbered while a job runs; a last line without its newline is
added once the job has ended, so a number never changes its text.

Following: while anyone watches a job, exactly one `LogFollower` (in one ASGI process)
reads new lines and publishes them in batches (every ≤ 100 ms): to `job.<id>` through
Redis while other processes have viewers of the job, straight to its own process's
sockets while they are the only ones (a single-process console then spends no Redis
round trip per batch). "Exactly one" is a Redis lease (SET NX PX, renewed every second,
released by its owner): every process with viewers of the job runs a follower loop, only
the lease holder reads, and if its process dies, another takes over within the lease
time, starting after the last line published (kept in Redis, saved every second; a
take-over may repeat up to a second of lines, which sockets drop by number). A
per-process registry alone would give one follower per process, i.e. duplicated
upstream reads (pod log streams) and duplicated batches with several web processes.
Sockets never depend on the follower for completeness: each one checks line numbers and
fills any gap from the store, so a hand-over or a dropped batch costs latency, not lines.

Secret values of the job (its secret env, including tenant secrets it references) are
masked in every line this module returns or publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gzip
import json
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Protocol

from django.conf import settings
from django.utils import timezone

from jobs import realtime
from jobs.backends.base import LogSource, LogStream
from jobs.models import Job
from jobs.realtime import LogLinePayload

log = logging.getLogger(__name__)

BACKFILL_LINES = 1000
FLUSH_SECONDS = 0.1  # a batch is published at least this often while lines arrive
FOLLOW_BATCH = 2000
LEASE_SECONDS = 5.0
REDIS_TIMEOUT_SECONDS = 5.0
# How long stopping a follower may take before it is abandoned (it was told to stop).
STOP_TIMEOUT_SECONDS = 5.0
MASK = "••••••"
# Shorter secret values are not masked: they would blank out ordinary words and digits.
MIN_SECRET_LENGTH = 4


@dataclass(frozen=True)
class StoredLine:
    line_no: int
    rank: int
    text: str


# --- masking ------------------------------------------------------------------------------


def job_secret_values(job: Job) -> list[str]:
    """The job's secret values worth masking, longest first (a value containing another
    is masked whole)."""
    from console.crypto import decrypt_json

    try:
        values = decrypt_json(job.secret_env_encrypted).values()
    except ValueError:
        return []
    found = {str(v) for v in values if len(str(v)) >= MIN_SECRET_LENGTH}
    return sorted(found, key=len, reverse=True)


class SecretMasker:
    def __init__(self, secrets: Iterable[str]):
        secrets = list(secrets)
        self.pattern = re.compile("|".join(re.escape(s) for s in secrets)) if secrets else None

    def __call__(self, text: str) -> str:
        if self.pattern is None:
            return text
        return self.pattern.sub(MASK, text)


def mask_secrets(text: str, secrets: Iterable[str]) -> str:
    return SecretMasker(secrets)(text)


# --- stores ---------------------------------------------------------------------------------


class LogStore(Protocol):
    def count(self, final: bool = False) -> int: ...

    def read(self, since_line: int, limit: int, final: bool = False) -> list[StoredLine]: ...


class _LineIndex:
    """Byte offsets of every STEP-th line of a growing file, so reading line n of a
    1,000,000-line log is a seek plus < STEP lines, not a scan from the start."""

    STEP = 1024
    CHUNK = 1 << 20

    def __init__(self, identity: tuple[int, int]):
        self.identity = identity  # (device, inode): a replaced file starts over
        self.offsets = [0]  # offsets[k] = start of line k*STEP + 1
        self.lines = 0  # complete lines indexed
        self.end = 0  # byte offset after them
        self.lock = threading.Lock()

    def extend(self, handle) -> None:
        """Index the complete lines written since the last call."""
        handle.seek(self.end)
        while True:
            chunk = handle.read(self.CHUNK)
            if not chunk:
                return
            last = chunk.rfind(b"\n")
            if last < 0:
                if len(chunk) < self.CHUNK:
                    return  # only a partial line so far
                handle.seek(self.end)  # one very long line: read to its end
                line = handle.readline()
                if not line.endswith(b"\n"):
                    return
                self.lines += 1
                self.end += len(line)
                if self.lines % self.STEP == 0:
                    self.offsets.append(self.end)
                continue
            # Cumulative lengths (without newlines) of the chunk's complete lines.
            lengths = list(accumulate(map(len, chunk[:last].split(b"\n"))))
            first_mark = (self.lines // self.STEP + 1) * self.STEP
            for mark in range(first_mark, self.lines + len(lengths) + 1, self.STEP):
                j = mark - self.lines - 1  # the mark's line, 0-based in this chunk
                self.offsets.append(self.end + lengths[j] + j + 1)
            self.lines += len(lengths)
            self.end += last + 1
            handle.seek(self.end)


class FileLog:
    """A plain text log file (the local backend's output.log): every line is rank 0."""

    _indexes: OrderedDict[str, _LineIndex] = OrderedDict()
    _indexes_lock = threading.Lock()
    MAX_INDEXES = 256

    def __init__(self, path: Path, rank: int = 0):
        self.path = Path(path)
        self.rank = rank

    def _index(self, handle) -> _LineIndex:
        stat = os.fstat(handle.fileno())
        identity = (stat.st_dev, stat.st_ino)
        key = str(self.path)
        with self._indexes_lock:
            index = self._indexes.get(key)
            if index is None or index.identity != identity or stat.st_size < index.end:
                index = _LineIndex(identity)
            self._indexes[key] = index
            self._indexes.move_to_end(key)
            while len(self._indexes) > self.MAX_INDEXES:
                self._indexes.popitem(last=False)
        with index.lock:
            if stat.st_size > index.end:
                index.extend(handle)
        return index

    @classmethod
    def forget(cls, path: Path) -> None:
        """Drop the cached index of a file that was deleted (its inode may be reused)."""
        with cls._indexes_lock:
            cls._indexes.pop(str(path), None)

    def count(self, final: bool = False) -> int:
        try:
            with open(self.path, "rb") as handle:
                index = self._index(handle)
                if final and os.fstat(handle.fileno()).st_size > index.end:
                    return index.lines + 1
                return index.lines
        except FileNotFoundError:
            return 0

    def read(self, since_line: int, limit: int, final: bool = False) -> list[StoredLine]:
        since_line = max(0, since_line)
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            return []
        with handle:
            index = self._index(handle)
            with index.lock:
                block = min(since_line // index.STEP, len(index.offsets) - 1)
                offset = index.offsets[block]
            number = block * index.STEP
            handle.seek(offset)
            found: list[StoredLine] = []
            while len(found) < limit:
                raw = handle.readline()
                if not raw:
                    break
                if not raw.endswith(b"\n") and not final:
                    break  # a line still being written gets its number once complete
                number += 1
                if number <= since_line:
                    continue
                found.append(
                    StoredLine(number, self.rank, raw.decode(errors="replace").rstrip("\r\n"))
                )
            return found


ARCHIVE_MEMBER_LINES = 1024


def archive_index_path(archive: Path) -> Path:
    return archive.with_name(archive.name + ".idx")


class ArchiveLog:
    """A finished job's archived log: gzip of JSON lines `[rank, text]`, one per line.

    Written as independent gzip members of `ARCHIVE_MEMBER_LINES` lines each (still one
    ordinary gzip file to any reader) plus an index of the members' byte offsets (a
    sidecar `.idx`), so a range read of a 1,000,000-line archive decompresses one or two
    members instead of the whole file. An archive without a matching index (written
    before the index existed, or torn) is read whole, as before."""

    _cache: OrderedDict[str, tuple[float, list[tuple[int, str]]]] = OrderedDict()
    _indexes: OrderedDict[str, tuple[tuple[float, int], dict]] = OrderedDict()
    _members: OrderedDict[tuple[str, float, int], list[bytes]] = OrderedDict()
    _lock = threading.Lock()
    MAX_MEMBERS = 16  # decompressed members kept: paging back through a log re-reads few

    def __init__(self, path: Path):
        self.path = Path(path)

    def _index(self) -> dict | None:
        """The archive's member index, or None where it is missing or not this file's."""
        stat = self.path.stat()
        stamp = (stat.st_mtime, stat.st_size)
        key = str(self.path)
        with self._lock:
            cached = self._indexes.get(key)
            if cached and cached[0] == stamp:
                return cached[1]
        try:
            index = json.loads(archive_index_path(self.path).read_text())
        except (OSError, ValueError):
            return None
        offsets = index.get("offsets") or []
        if index.get("version") != 1 or not offsets or offsets[-1] != stat.st_size:
            return None  # an index of another write of this archive
        with self._lock:
            self._indexes[key] = (stamp, index)
            while len(self._indexes) > 64:
                self._indexes.popitem(last=False)
        return index

    def _member(self, index: dict, number: int) -> list[bytes]:
        """Member `number`'s raw lines (JSON, without newlines)."""
        stamp = self.path.stat().st_mtime
        key = (str(self.path), stamp, number)
        with self._lock:
            cached = self._members.get(key)
            if cached is not None:
                self._members.move_to_end(key)
                return cached
        start, end = index["offsets"][number], index["offsets"][number + 1]
        with open(self.path, "rb") as handle:
            handle.seek(start)
            data = gzip.decompress(handle.read(end - start))
        rows = data.split(b"\n")
        if rows and not rows[-1]:
            rows.pop()
        with self._lock:
            self._members[key] = rows
            while len(self._members) > self.MAX_MEMBERS:
                self._members.popitem(last=False)
        return rows

    def _lines(self) -> list[tuple[int, str]]:
        mtime = self.path.stat().st_mtime
        key = str(self.path)
        with self._lock:
            cached = self._cache.get(key)
            if cached and cached[0] == mtime:
                self._cache.move_to_end(key)
                return cached[1]
        with gzip.open(self.path, "rt", encoding="utf-8") as handle:
            lines = [tuple(json.loads(row)) for row in handle]
        with self._lock:
            self._cache[key] = (mtime, lines)
            while len(self._cache) > 2:
                self._cache.popitem(last=False)
        return lines

    def count(self, final: bool = True) -> int:
        index = self._index()
        if index is not None:
            return index["lines"]
        return len(self._lines())

    def read(self, since_line: int, limit: int, final: bool = True) -> list[StoredLine]:
        start = max(0, since_line)
        index = self._index()
        if index is None:
            return [
                StoredLine(number, rank, text)
                for number, (rank, text) in enumerate(
                    self._lines()[start : start + limit], start=start + 1
                )
            ]
        per_member = index["member_lines"]
        members = len(index["offsets"]) - 1
        found: list[StoredLine] = []
        number = start
        while len(found) < limit and number < index["lines"]:
            member = number // per_member
            if member >= members:
                break
            rows = self._member(index, member)
            skip = number - member * per_member
            for raw in rows[skip : skip + limit - len(found)]:
                rank, text = json.loads(raw)
                number += 1
                found.append(StoredLine(number, rank, text))
            if skip >= len(rows):
                break  # a short member before the last: the index lies; stop, don't spin
        return found


def write_archive(target: Path, lines: Iterable[tuple[int, str]]) -> int:
    """Write `(rank, text)` lines as an indexed archive (see `ArchiveLog`), atomically:
    the index first, then the archive, each renamed into place. Returns the line count."""
    target.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    tmp = target.with_name(f".{target.name}.{token}.tmp")
    index_tmp = target.with_name(f".{target.name}.{token}.idx.tmp")
    offsets = [0]
    try:
        total = _write_members(tmp, lines, offsets)
        index_tmp.write_text(
            json.dumps(
                {
                    "version": 1,
                    "member_lines": ARCHIVE_MEMBER_LINES,
                    "lines": total,
                    "offsets": offsets,
                }
            )
        )
        index_tmp.replace(archive_index_path(target))
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
        index_tmp.unlink(missing_ok=True)
    return total


def _write_members(path: Path, lines: Iterable[tuple[int, str]], offsets: list[int]) -> int:
    total = 0
    member: list[str] = []
    with open(path, "wb") as archive:

        def flush() -> None:
            data = "".join(member).encode("utf-8")
            # mtime=0: the same log always compresses to the same bytes.
            archive.write(gzip.compress(data, compresslevel=6, mtime=0))
            offsets.append(archive.tell())
            member.clear()

        for rank, text in lines:
            member.append(json.dumps([rank, text], ensure_ascii=False) + "\n")
            total += 1
            if len(member) == ARCHIVE_MEMBER_LINES:
                flush()
        if member or total == 0:
            flush()
    return total


class KubernetesSpool:
    """The numbered store of a Kubernetes job: JSON lines `[attempt, rank, text]` appended
    in the order the console read them, plus how many lines of each source (a pod's log,
    `LogSource.key`) it holds, so a later read of a pod's log appends only what is new.
    Appends hold an exclusive file lock (the web process, a worker and the follower may
    all append)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.path = self.directory / "spool.jsonl"
        self.counts_path = self.directory / "counts.json"

    def counts(self) -> dict[str, int]:
        """Lines held per source key."""
        try:
            return json.loads(self.counts_path.read_text())
        except (OSError, ValueError):
            return {}

    def append(self, attempt: int, batches: Iterable[tuple[LogSource, int, list[str]]]) -> int:
        """Append sources' lines that the spool lacks: each batch is `(source, first,
        texts)`, `texts` being the source's lines from its `first` (0-based) on. Returns
        how many lines were added."""
        batches = [batch for batch in batches if batch[2]]
        if not batches:
            return 0
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            counts = self.counts()
            rows = []
            for source, first, texts in batches:
                have = counts.get(source.key, 0)
                if first > have:
                    # A gap would renumber nothing but lose lines: never append past one.
                    log.warning("log of %s: lines %d… offered, %d held", source.key, first, have)
                    continue
                fresh = texts[have - first :]
                rows.extend(json.dumps([attempt, source.rank, text]) + "\n" for text in fresh)
                counts[source.key] = have + len(fresh)
            if rows:
                with open(self.path, "a", encoding="utf-8") as spool:
                    spool.writelines(rows)
                tmp = self.counts_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(counts))
                tmp.replace(self.counts_path)
            return len(rows)

    def count(self, final: bool = False) -> int:
        return FileLog(self.path).count()

    def read(self, since_line: int, limit: int, final: bool = False) -> list[StoredLine]:
        lines = []
        for stored in FileLog(self.path).read(since_line, limit):
            _attempt, rank, text = json.loads(stored.text)
            lines.append(StoredLine(stored.line_no, rank, text))
        return lines


def archive_path(job: Job) -> Path:
    root = Path(getattr(settings, "LOG_ARCHIVE_DIR", "") or Path(settings.DATA_DIR) / "log-archive")
    return root / str(job.tenant_id) / f"job-{job.pk}.jsonl.gz"


def spool_dir(job: Job) -> Path:
    return Path(settings.DATA_DIR) / "logs" / str(job.pk)


def _local_log_path(job: Job) -> Path:
    # The local backend's layout (jobs.backends.local.LocalBackend.log_path), without
    # creating the run directory as a side effect of reading.
    return Path(settings.DATA_DIR) / "jobs" / str(job.pk) / "output.log"


def _local_final(job: Job) -> bool:
    return (Path(settings.DATA_DIR) / "jobs" / str(job.pk) / "exit_code").exists()


def store_for(job: Job, *, sync: bool = True) -> tuple[LogStore, bool]:
    """The store to read `job`'s lines from, and whether its last partial line counts.

    For a Kubernetes job still on its pods, `sync` first appends what they printed since
    the last read, unless a follower keeps the spool current (it holds the job's lease)."""
    if job.backend == "local":
        path = _local_log_path(job)
        if path.exists():
            return FileLog(path), _local_final(job) or job.is_finished
    else:
        spool = KubernetesSpool(spool_dir(job))
        if not job.is_finished or not archive_path(job).exists():
            if sync and not _followed(job.pk):
                kubernetes_sync(job)
            if spool.path.exists():
                return spool, True
    archived = archive_path(job)
    if archived.exists():
        return ArchiveLog(archived), True
    return FileLog(_local_log_path(job)), True


# --- Kubernetes: reading pod logs into the spool ----------------------------------------------


def kubernetes_sync(job: Job) -> int:
    """Append what the job's pods printed since the spool's last read (one read of each
    pod's log, no waiting); returns lines added. An unreachable API adds nothing."""
    from jobs.backends import BackendRejected, BackendUnavailable, get_backend

    spool = KubernetesSpool(spool_dir(job))
    try:
        backend = get_backend("kubernetes")
        held = spool.counts()
        batches = []
        for source in backend.log_sources(job):
            skip = held.get(source.key, 0)
            stream = backend.open_log(job, source, skip=skip, follow=False)
            batches.append((source, skip, stream.poll()))
    except (BackendUnavailable, BackendRejected) as error:
        log.warning("reading pod logs of job %s failed: %s", job.pk, error)
        return 0
    return spool.append(job.attempt, batches)


# --- reading (API, backfill, gap filling) -------------------------------------------------------


def _payload(lines: list[StoredLine], masker: SecretMasker, ts: str) -> list[LogLinePayload]:
    return [
        LogLinePayload(line_no=ln.line_no, rank=ln.rank, text=masker(ln.text), ts=ts)
        for ln in lines
    ]


def read_lines(job: Job, *, since_line: int = 0, limit: int = 1000) -> dict:
    """`{"lines": [...], "next_line": N}` for lines after `since_line` (exclusive), masked.

    `next_line` is the number to pass as `since_line` for what follows."""
    store, final = store_for(job)
    lines = store.read(since_line, limit, final=final)
    payload = _payload(lines, SecretMasker(job_secret_values(job)), realtime.now_iso())
    return {"lines": payload, "next_line": lines[-1].line_no if lines else since_line}


def line_count(job: Job) -> int:
    store, final = store_for(job)
    return store.count(final=final)


def tail_lines(job: Job, count: int = BACKFILL_LINES) -> tuple[list[LogLinePayload], int]:
    """The last `count` lines (masked), and the number of the last one (0 if none)."""
    store, final = store_for(job)
    total = store.count(final=final)
    lines = store.read(max(0, total - count), count, final=final)
    last = lines[-1].line_no if lines else total
    return _payload(lines, SecretMasker(job_secret_values(job)), realtime.now_iso()), last


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
    for line in iter_all_lines(job):
        text = masker(line.text)
        buffer.append(f"[{line.rank}] {text}\n" if prefix else f"{text}\n")
        if len(buffer) >= 2000:
            yield "".join(buffer).encode()
            buffer.clear()
    if buffer:
        yield "".join(buffer).encode()


# --- archive ----------------------------------------------------------------------------------


def job_log_archive(*, job: Job) -> Path | None:
    """Compress a finished job's full log (masked) into the archive; idempotent.

    Returns the archive's path, or None while the job is still running."""
    from jobs.models import JobLogArchive

    if not job.is_finished:
        return None
    existing = JobLogArchive.objects.filter(job=job).first()
    target = archive_path(job)
    if existing is not None and target.exists():
        return target
    if job.backend != "local":
        kubernetes_sync(job)
    masker = SecretMasker(job_secret_values(job))
    # Read the live source, never a previous archive (which may be what's missing).
    if job.backend == "local":
        source: LogStore = FileLog(_local_log_path(job))
    else:
        source = KubernetesSpool(spool_dir(job))

    def masked() -> Iterator[tuple[int, str]]:
        since = 0
        while True:
            chunk = source.read(since, 5000, final=True)
            if not chunk:
                return
            for line in chunk:
                yield line.rank, masker(line.text)
            since = chunk[-1].line_no

    lines = write_archive(target, masked())
    JobLogArchive.objects.update_or_create(
        job=job,
        defaults={
            "path": str(target),
            "lines": lines,
            "size_bytes": target.stat().st_size,
            "archived_at": timezone.now(),
        },
    )
    return target


def logs_archive_finished(*, limit: int = 100) -> int:
    """Archive the logs of finished jobs that have none yet (a periodic task calls this,
    so a log is archived even if nobody watched the job). Returns how many."""
    from jobs.models import FINISHED

    jobs = Job.objects.filter(status__in=FINISHED, log_archive__isnull=True).order_by(
        "finished_at"
    )[:limit]
    done = 0
    for job in jobs:
        try:
            if job_log_archive(job=job) is not None:
                done += 1
        except OSError:
            log.warning("archiving the log of job %s failed", job.pk, exc_info=True)
    return done


# --- following (in the ASGI process) ------------------------------------------------------------


def _redis_prefix() -> str:
    return str(settings.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("prefix", "gpugeek"))


class _RedisClients:
    """One asyncio Redis client per event loop (a client is bound to its loop)."""

    def __init__(self):
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self):
        import redis.asyncio as aioredis

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # Leases, hashes and scripts only (no blocking commands): an answer that takes
            # longer than this is a lost connection, never a reason to wait forever.
            client = aioredis.from_url(
                settings.REDIS_URL or "redis://127.0.0.1:1/0",
                socket_timeout=REDIS_TIMEOUT_SECONDS,
                socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
            )
            self._clients[loop] = client
        return client

    async def close(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.aclose(), REDIS_TIMEOUT_SECONDS)


_redis = _RedisClients()
_sync_redis: dict[str, object] = {}


def _lease_key(job_id: int) -> str:
    return f"{_redis_prefix()}:logfollow:{job_id}:lease"


def _followed(job_id: int) -> bool:
    """Whether some process's follower holds the job's lease (and so keeps its store
    current); False when Redis can't tell."""
    import redis

    url = settings.REDIS_URL or "redis://127.0.0.1:1/0"
    client = _sync_redis.get(url)
    if client is None:
        client = _sync_redis[url] = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    try:
        return bool(client.exists(_lease_key(job_id)))
    except redis.RedisError:
        return False


_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
_RENEW = """
local current = redis.call('get', KEYS[1])
if current == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end
if not current then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""


class _LocalReader:
    """New lines of a local job: its backend's stream of the output file, polled in the
    event loop (a non-blocking read of the bytes written since the last poll)."""

    interval = FLUSH_SECONDS

    def __init__(self, stream: LogStream, cursor: int):
        self.stream = stream
        self.cursor = cursor
        self.first: list[str] = []

    @classmethod
    def open(cls, backend, job: Job, cursor: int) -> _LocalReader:
        """Blocking (run it in a thread): the first poll finds the cursor's line in the
        file, a scan of up to the whole file."""
        (source,) = backend.log_sources(job)
        reader = cls(backend.open_log(job, source, skip=cursor), cursor)
        reader.first = reader.stream.poll()
        return reader

    async def read(self) -> list[StoredLine]:
        texts = self.stream.poll()
        if self.first:
            texts, self.first = self.first + texts, []
        lines = [StoredLine(self.cursor + i, 0, text) for i, text in enumerate(texts, 1)]
        self.cursor += len(lines)
        return lines

    def close(self) -> None:
        self.stream.close()


class _KubernetesReader:
    """New lines of a Kubernetes job: one backend stream per pod (the pod log API with
    `follow=True`, read by the stream's own thread), appended to the job's spool (which
    numbers them) and read back from it. Pods that start later (or replace a rank's pod)
    are found by listing the attempt's pods: every second while a rank is not followed,
    every `SETTLED_LIST_SECONDS` once all are."""

    interval = 1.0  # at most this long without a look, even when no stream wakes us
    SETTLED_LIST_SECONDS = 15.0

    def __init__(self, backend, job: Job, cursor: int, wake):
        self.backend = backend
        self.job = job
        self.cursor = cursor
        self.wake = wake
        self.spool = KubernetesSpool(spool_dir(job))
        self.streams: dict[str, LogStream] = {}
        self.read_upto: dict[str, int] = {}  # per stream: lines of its source seen so far
        self.done: set[str] = set()  # sources that stopped and were read to their end
        self.listed_at = 0.0

    @classmethod
    def open(cls, backend, job: Job, cursor: int, wake) -> _KubernetesReader:
        return cls(backend, job, cursor, wake)

    def _list_due(self) -> bool:
        settled = len(self.streams) >= self.job.nodes
        wait = self.SETTLED_LIST_SECONDS if settled else 1.0
        return time.monotonic() - self.listed_at >= wait

    def _list(self) -> None:
        self.listed_at = time.monotonic()
        held = self.spool.counts()
        for source in self.backend.log_sources(self.job):
            if source.key in self.streams or source.key in self.done:
                continue
            skip = held.get(source.key, 0)
            self.streams[source.key] = self.backend.open_log(
                self.job, source, skip=skip, wake=self.wake
            )
            self.read_upto[source.key] = skip

    def _collect(self, listing: bool) -> list[StoredLine]:
        from jobs.backends import BackendRejected, BackendUnavailable

        try:
            if listing:
                self._list()
        except (BackendUnavailable, BackendRejected) as error:
            log.warning("listing the pods of job %s failed: %s", self.job.pk, error)
        batches = []
        for key, stream in list(self.streams.items()):
            ended = stream.ended  # read before polling: a line that came meanwhile is kept
            lines = stream.poll()
            batches.append((stream.source, self.read_upto[key], lines))
            self.read_upto[key] += len(lines)
            if ended:
                del self.streams[key]
                if not stream.source.live:
                    self.done.add(key)
                self.listed_at = 0.0  # a stream stopped: look for its pod's successor
        self.spool.append(self.job.attempt, batches)
        lines = self.spool.read(self.cursor, FOLLOW_BATCH)
        if lines:
            self.cursor = lines[-1].line_no
        return lines

    async def read(self) -> list[StoredLine]:
        from asgiref.sync import sync_to_async

        listing = self._list_due()
        if listing:  # a new attempt has new pods
            await sync_to_async(self.job.refresh_from_db)(fields=["attempt", "status"])
        return await asyncio.to_thread(self._collect, listing)

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()
        self.streams.clear()


# Identifies this process among those with viewers of a job (see LogFollower).
PROCESS_ID = uuid.uuid4().hex
VIEWER_TTL_SECONDS = 5.0


class LogFollower:
    """Reads a job's new log lines and publishes them while this process has viewers.

    Started with the first local viewer, cancelled with the last. Only the holder of the
    job's Redis lease reads; the others wait to take over. Every second each process with
    viewers of the job notes it in a Redis hash; while the lease holder's process is the
    only one, batches go straight to its sockets (no Redis round trips per batch), else
    through the `job.<id>` group for every process."""

    def __init__(self, job_id: int, process_id: str = PROCESS_ID):
        self.job_id = job_id
        self.process_id = process_id
        self.token = uuid.uuid4().hex
        prefix = _redis_prefix()
        self.lease_key = f"{prefix}:logfollow:{job_id}:lease"
        self.cursor_key = f"{prefix}:logfollow:{job_id}:cursor"
        self.viewers_key = f"{prefix}:logfollow:{job_id}:viewers"
        self.holding = False
        self.local_only = False
        self.cursor: int | None = None  # the last line published
        self._checked = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def _hold_lease(self, client) -> bool:
        try:
            held = await client.eval(
                _RENEW, 1, self.lease_key, self.token, int(LEASE_SECONDS * 1000)
            )
        except Exception:
            log.warning("log follower lease for job %s: Redis unavailable", self.job_id)
            return False
        return bool(held)

    async def _note_viewers(self, client) -> None:
        """Record that this process has viewers of the job (now)."""
        with contextlib.suppress(Exception):
            await client.hset(self.viewers_key, self.process_id, time.time())
            await client.expire(self.viewers_key, int(VIEWER_TTL_SECONDS * 4))

    async def _only_local_viewers(self, client) -> bool:
        try:
            noted = await client.hgetall(self.viewers_key)
        except Exception:
            return False
        fresh = {
            key.decode() if isinstance(key, bytes) else key
            for key, at in noted.items()
            if time.time() - float(at) < VIEWER_TTL_SECONDS
        }
        return fresh <= {self.process_id}

    async def release(self) -> None:
        client = _redis.get()
        with contextlib.suppress(Exception):
            await client.hdel(self.viewers_key, self.process_id)
        if not self.holding:
            return
        self.holding = False
        with contextlib.suppress(Exception):
            await client.eval(_RELEASE, 1, self.lease_key, self.token)

    async def _publish(self, lines: list[LogLinePayload], last_line: int) -> None:
        if self.local_only:
            await realtime.hub().deliver_local(
                realtime.job_group(self.job_id),
                realtime.JobLogMessage(
                    type="log", job_id=self.job_id, lines=lines, last_line=last_line
                ),
            )
        else:
            await realtime.apublish_job_logs(self.job_id, lines, last_line=last_line)

    async def _keep(self, client) -> None:
        """Every second: note this process's viewers, hold (or wait for) the lease, check
        for viewers in other processes and save the cursor. A task of its own, so a slow
        Redis answer never delays the reading loop's next poll."""
        saved_cursor: int | None = None
        while True:
            await self._note_viewers(client)
            holding = await self._hold_lease(client)
            if holding:
                was_local = self.local_only
                self.local_only = await self._only_local_viewers(client)
                cursor = self.cursor
                if was_local and not self.local_only and cursor is not None:
                    # Viewers elsewhere now: tell them how far the log reaches.
                    await realtime.apublish_job_logs(self.job_id, [], last_line=cursor)
                if cursor is not None and cursor != saved_cursor:
                    with contextlib.suppress(Exception):
                        await client.set(self.cursor_key, cursor, ex=7 * 24 * 3600)
                        saved_cursor = cursor
            self.holding = holding
            self._checked.set()
            await asyncio.sleep(1.0)

    async def run(self) -> None:
        from asgiref.sync import sync_to_async

        from jobs.backends import get_backend

        client = _redis.get()
        cursor: int | None = None
        masker: SecretMasker | None = None
        reader: _LocalReader | _KubernetesReader | None = None
        woken = asyncio.Event()
        loop = asyncio.get_running_loop()

        def wake() -> None:  # from a stream's reading thread
            loop.call_soon_threadsafe(woken.set)

        keeper = asyncio.ensure_future(self._keep(client))
        polled_at = time.monotonic()
        try:
            while True:
                if not self.holding:
                    if reader is not None:
                        reader.close()
                    reader = cursor = self.cursor = None
                    self._checked.clear()
                    await self._checked.wait()  # the keeper's next look at the lease
                    continue
                try:
                    if reader is None or cursor is None:
                        job = await sync_to_async(Job.objects.get)(pk=self.job_id)
                        masker = SecretMasker(await sync_to_async(job_secret_values)(job))
                        end = await asyncio.to_thread(line_count, job)
                        stored = await client.get(self.cursor_key)
                        cursor = min(int(stored), end) if stored is not None else end
                        self.cursor = cursor
                        backend = await asyncio.to_thread(get_backend, job.backend)
                        if job.backend == "local":
                            reader = await asyncio.to_thread(
                                _LocalReader.open, backend, job, cursor
                            )
                        else:
                            reader = _KubernetesReader.open(backend, job, cursor, wake)
                        # Tells sockets how far the store reaches, so none waits on a gap.
                        await realtime.apublish_job_logs(self.job_id, [], last_line=cursor)
                        if self.local_only:
                            await self._publish([], cursor)
                    woken.clear()
                    lines = await reader.read()
                except Job.DoesNotExist:
                    return
                except Exception:
                    log.warning(
                        "log follower of job %s failed; retrying", self.job_id, exc_info=True
                    )
                    if reader is not None:
                        reader.close()
                    reader = cursor = None
                    await asyncio.sleep(1.0)
                    continue
                if lines:
                    cursor = self.cursor = lines[-1].line_no
                    await self._publish(_payload(lines, masker, realtime.now_iso()), cursor)
                    if len(lines) >= FOLLOW_BATCH:
                        continue
                if isinstance(reader, _LocalReader):
                    # A file is polled at a fixed rate, not "sleep after work" (which adds
                    # the work and the event loop's lag to every line's wait), but never
                    # twice within half an interval (more, smaller batches cost more).
                    now = time.monotonic()
                    polled_at = max(polled_at + reader.interval, now + reader.interval / 2)
                    await asyncio.sleep(polled_at - now)
                    continue
                # A pod log stream wakes us when lines come.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), reader.interval)
                if woken.is_set():
                    await asyncio.sleep(FLUSH_SECONDS / 2)  # let a burst make one batch
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await keeper
            if reader is not None:
                reader.close()


class _FollowerRegistry:
    """This process's followers, one per job with at least one local viewer."""

    def __init__(self):
        self.followers: dict[tuple[int, int], LogFollower] = {}
        self.viewers: dict[tuple[int, int], int] = {}

    def _key(self, job_id: int) -> tuple[int, int]:
        return (id(asyncio.get_running_loop()), job_id)

    def watch(self, job_id: int) -> None:
        key = self._key(job_id)
        self.viewers[key] = self.viewers.get(key, 0) + 1
        if key not in self.followers:
            follower = LogFollower(job_id)
            follower.task = asyncio.ensure_future(follower.run())
            self.followers[key] = follower

    async def unwatch(self, job_id: int) -> None:
        key = self._key(job_id)
        remaining = self.viewers.get(key, 0) - 1
        if remaining > 0:
            self.viewers[key] = remaining
            return
        self.viewers.pop(key, None)
        follower = self.followers.pop(key, None)
        if follower is not None and follower.task is not None:
            follower.task.cancel()
            # Bounded: a follower stuck in a call that ignores cancellation must not hang
            # the socket's disconnect (or a server's shutdown) with it.
            await asyncio.wait({follower.task}, timeout=STOP_TIMEOUT_SECONDS)
            await follower.release()

    def active(self, job_id: int) -> bool:
        return self._key(job_id) in self.followers


followers = _FollowerRegistry()


async def close_for_loop() -> None:
    """Stop this loop's followers and close its Redis client (tests, shutdown)."""
    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in followers.followers if k[0] == loop_id]:
        followers.viewers[key] = 1
        await followers.unwatch(key[1])
    await _redis.close()
