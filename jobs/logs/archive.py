"""The archive of a finished job's log: gzip members plus an index of their offsets
(under LOG_ARCHIVE_DIR), written once, masked, so the log stays readable by range after
its pods (or run directory) are gone."""

from __future__ import annotations

import bisect
import gzip
import json
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from jobs.backends import get_backend
from jobs.logs.masking import SecretMasker, job_secret_values
from jobs.logs.stores import FileLog, LogSpool, LogStore, StoredLine, spool_dir, spool_sync
from jobs.models import FINISHED, Job, JobLogArchive

log = logging.getLogger(__name__)

ARCHIVE_MEMBER_LINES = 1024
ARCHIVE_MEMBER_BYTES = 1 << 20  # of text; a member is decompressed whole to read it
LEGACY_ROW_BYTES = 4 << 20


def archive_index_path(archive: Path) -> Path:
    return archive.with_name(archive.name + ".idx")


class ArchiveLog:
    """A finished job's archived log: gzip of JSON lines `[rank, text]`, one per line.

    Written as independent gzip members of at most `ARCHIVE_MEMBER_LINES` lines and about
    `ARCHIVE_MEMBER_BYTES` of text each (still one ordinary gzip file to any reader) plus
    an index of the members' byte offsets and first lines (a sidecar `.idx`), so a range
    read of a 1,000,000-line archive decompresses one or two bounded members instead of
    the whole file. An archive without a matching index (written before the index
    existed, or torn) is rewritten as an indexed one on its first read (streamed, in
    bounded steps, never loaded whole). A read returns at most `READ_BYTES` of text (and at
    least one line)."""

    _cache: OrderedDict[tuple[str, float, int], int] = OrderedDict()  # unindexed: counts
    _indexes: OrderedDict[str, tuple[tuple[float, int], dict]] = OrderedDict()
    _members: OrderedDict[tuple[str, float, int], list[bytes]] = OrderedDict()
    _lock = threading.Lock()
    MAX_MEMBERS = 16  # decompressed members kept: paging back through a log re-reads few
    READ_BYTES = 1 << 20

    def __init__(self, path: Path):
        self.path = Path(path)

    def _index(self) -> dict | None:
        """The archive's member index (with `firsts`: each member's first line, 0-based,
        and the total last), or None where it is missing or not this file's."""
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
        if not offsets or offsets[-1] != stat.st_size:
            return None  # an index of another write of this archive
        members = len(offsets) - 1
        if index.get("version") == 1:  # members of `member_lines` lines each
            per = index["member_lines"]
            index["firsts"] = [min(n * per, index["lines"]) for n in range(members)]
            index["firsts"].append(index["lines"])
        elif index.get("version") != 2 or len(index.get("firsts") or []) != members + 1:
            return None
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

    def _stream(self) -> Iterator[tuple[int, str]]:
        """An unindexed archive's lines from the start, in bounded steps: a row longer
        than `LEGACY_ROW_BYTES` (written before lines were split) stands as a note."""
        with gzip.open(self.path, "rb") as handle:
            while True:
                raw = handle.readline(LEGACY_ROW_BYTES)
                if not raw:
                    return
                if not raw.endswith(b"\n") and len(raw) == LEGACY_ROW_BYTES:
                    size = len(raw)
                    while raw and not raw.endswith(b"\n"):
                        raw = handle.readline(LEGACY_ROW_BYTES)
                        size += len(raw)
                    yield 0, f"[a line of {size} bytes is too long to show]"
                    continue
                rank, text = json.loads(raw)
                yield rank, text

    def _upgraded(self) -> dict | None:
        """The index, after rewriting an unindexed archive as an indexed one (in bounded
        steps, atomically, as `write_archive` does); None where that is not possible
        (e.g. a read-only archive directory): then the archive is streamed."""
        index = self._index()
        if index is None:
            try:
                write_archive(self.path, self._stream())
            except OSError:
                log.warning("indexing the log archive %s failed", self.path, exc_info=True)
                return None
            index = self._index()
        return index

    def count(self, final: bool = True) -> int:
        index = self._upgraded()
        if index is not None:
            return index["lines"]
        stat = self.path.stat()
        key = (str(self.path), stat.st_mtime, stat.st_size)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        total = sum(1 for _ in self._stream())
        with self._lock:
            self._cache[key] = total
            while len(self._cache) > 64:
                self._cache.popitem(last=False)
        return total

    def read(self, since_line: int, limit: int, final: bool = True) -> list[StoredLine]:
        start = max(0, since_line)
        found: list[StoredLine] = []
        budget = self.READ_BYTES
        index = self._upgraded()
        if index is None:
            for number, (rank, text) in enumerate(self._stream(), start=1):
                if number <= start:
                    continue
                found.append(StoredLine(number, rank, text))
                budget -= len(text) + 1
                if len(found) >= limit or budget <= 0:
                    break
            return found
        firsts = index["firsts"]
        number = start
        while len(found) < limit and budget > 0 and number < index["lines"]:
            member = bisect.bisect_right(firsts, number) - 1
            if member >= len(firsts) - 1:
                break
            rows = self._member(index, member)
            skip = number - firsts[member]
            if skip >= len(rows):
                break  # a member shorter than its index says: stop, don't spin
            for raw in rows[skip : skip + limit - len(found)]:
                rank, text = json.loads(raw)
                number += 1
                found.append(StoredLine(number, rank, text))
                budget -= len(raw) + 1
                if budget <= 0:
                    break
        return found


def write_archive(target: Path, lines: Iterable[tuple[int, str]]) -> int:
    """Write `(rank, text)` lines as an indexed archive (see `ArchiveLog`), atomically:
    the index first, then the archive, each renamed into place. Returns the line count."""
    target.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    tmp = target.with_name(f".{target.name}.{token}.tmp")
    index_tmp = target.with_name(f".{target.name}.{token}.idx.tmp")
    offsets = [0]
    firsts = [0]
    try:
        total = _write_members(tmp, lines, offsets, firsts)
        index_tmp.write_text(
            json.dumps({"version": 2, "lines": total, "offsets": offsets, "firsts": firsts})
        )
        index_tmp.replace(archive_index_path(target))
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
        index_tmp.unlink(missing_ok=True)
    return total


def _write_members(
    path: Path, lines: Iterable[tuple[int, str]], offsets: list[int], firsts: list[int]
) -> int:
    total = 0
    member: list[str] = []
    size = 0
    with open(path, "wb") as archive:

        def flush() -> None:
            data = "".join(member).encode("utf-8")
            # mtime=0: the same log always compresses to the same bytes.
            archive.write(gzip.compress(data, compresslevel=6, mtime=0))
            offsets.append(archive.tell())
            firsts.append(total)
            member.clear()

        for rank, text in lines:
            row = json.dumps([rank, text], ensure_ascii=False) + "\n"
            member.append(row)
            size += len(row)
            total += 1
            if len(member) == ARCHIVE_MEMBER_LINES or size >= ARCHIVE_MEMBER_BYTES:
                flush()
                size = 0
        if member or total == 0:
            flush()
    return total


def archive_path(job: Job) -> Path:
    root = Path(settings.LOG_ARCHIVE_DIR or Path(settings.DATA_DIR) / "log-archive")
    return root / str(job.tenant_id) / f"job-{job.pk}.jsonl.gz"


def job_log_archive(*, job: Job) -> Path | None:
    """Compress a finished job's full log (masked) into the archive; idempotent.

    Returns the archive's path, or None while the job is still running."""
    if not job.is_finished:
        return None
    existing = JobLogArchive.objects.filter(job=job).first()
    target = archive_path(job)
    if existing is not None and target.exists():
        return target
    backend = get_backend(job.backend)
    own = backend.log_file(job)
    if own is None:
        spool_sync(job, backend)
    masker = SecretMasker(job_secret_values(job))
    # Read the live source, never a previous archive (which may be what's missing).
    source: LogStore = FileLog(own.path) if own is not None else LogSpool(spool_dir(job))

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
