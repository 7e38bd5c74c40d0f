"""Numbered line stores: a growing text file read by line number (FileLog), and the
spool that numbers the lines of a job's log sources in arrival order (LogSpool), with
`spool_sync` to append what the sources printed since the last read."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from django.conf import settings

from jobs.backends import BackendRejected, BackendUnavailable, ComputeBackend
from jobs.backends.base import LogSource
from jobs.logs.lines import MAX_LINE_BYTES, decode, log_cap, split_pieces, truncation_line
from jobs.models import Job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredLine:
    line_no: int
    rank: int
    text: str


class LogStore(Protocol):
    def count(self, final: bool = False) -> int: ...

    def read(self, since_line: int, limit: int, final: bool = False) -> list[StoredLine]: ...


class _LineIndex:
    """Byte offsets of every STEP-th line of a growing file, so reading line n of a
    1,000,000-line log is a seek plus < STEP lines, not a scan from the start. Lines are
    the pieces of jobs.logs.lines; the file is read in bounded chunks, never a whole line
    at once."""

    STEP = 1024

    def __init__(self, identity: tuple[int, int], limit: int):
        self.identity = identity  # (device, inode): a replaced file starts over
        self.limit = limit  # the longest piece
        self.chunk = max(1 << 20, 2 * limit)  # > limit: every full chunk holds a piece
        self.offsets = [0]  # offsets[k] = start of line k*STEP + 1
        self.lines = 0  # complete lines indexed
        self.end = 0  # byte offset after them
        self.lock = threading.Lock()

    def extend(self, handle, size: int) -> None:
        """Index the complete lines in the file's first `size` bytes not indexed yet."""
        while self.end < size:
            handle.seek(self.end)
            chunk = handle.read(min(self.chunk, size - self.end))
            if not chunk:
                return
            _pieces, ends = split_pieces(chunk, limit=self.limit)
            if not ends:
                return  # only a partial line so far
            first_mark = (self.lines // self.STEP + 1) * self.STEP
            for mark in range(first_mark, self.lines + len(ends) + 1, self.STEP):
                self.offsets.append(self.end + ends[mark - self.lines - 1])
            self.lines += len(ends)
            self.end += ends[-1]


class FileLog:
    """A plain text log file (e.g. the local backend's output.log): every line is rank 0.

    Lines are split and capped as jobs.logs.lines says (`capped=False` for a file the
    console writes itself, e.g. the spool, whose rows are at most `limit` bytes). A read
    returns at most `READ_BYTES` of text (and at least one line), so no page of a log of
    huge lines holds more than about that much."""

    _indexes: OrderedDict[str, _LineIndex] = OrderedDict()
    _indexes_lock = threading.Lock()
    MAX_INDEXES = 256
    READ_BYTES = 1 << 20

    def __init__(
        self, path: Path, rank: int = 0, *, limit: int = MAX_LINE_BYTES, capped: bool = True
    ):
        self.path = Path(path)
        self.rank = rank
        self.limit = limit
        self.cap = log_cap() if capped else None

    def _size(self, handle) -> tuple[int, bool]:
        """The bytes to read, and whether the file went past the cap (then it is final)."""
        size = os.fstat(handle.fileno()).st_size
        if self.cap is not None and size > self.cap:
            return self.cap, True
        return size, False

    def _index(self, handle, size: int) -> _LineIndex:
        stat = os.fstat(handle.fileno())
        identity = (stat.st_dev, stat.st_ino)
        key = str(self.path)
        with self._indexes_lock:
            index = self._indexes.get(key)
            if (
                index is None
                or index.identity != identity
                or index.limit != self.limit
                or size < index.end
            ):
                index = _LineIndex(identity, self.limit)
            self._indexes[key] = index
            self._indexes.move_to_end(key)
            while len(self._indexes) > self.MAX_INDEXES:
                self._indexes.popitem(last=False)
        with index.lock:
            if size > index.end:
                index.extend(handle, size)
        return index

    @classmethod
    def forget(cls, path: Path) -> None:
        """Drop the cached index of a file that was deleted (its inode may be reused)."""
        with cls._indexes_lock:
            cls._indexes.pop(str(path), None)

    def count(self, final: bool = False) -> int:
        try:
            with open(self.path, "rb") as handle:
                size, truncated = self._size(handle)
                index = self._index(handle, size)
                with index.lock:
                    lines, end = index.lines, index.end
                if truncated:
                    return lines + (size > end) + 1
                return lines + (final and size > end)
        except FileNotFoundError:
            return 0

    def read(self, since_line: int, limit: int, final: bool = False) -> list[StoredLine]:
        since_line = max(0, since_line)
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            return []
        with handle:
            size, truncated = self._size(handle)
            final = final or truncated
            index = self._index(handle, size)
            with index.lock:
                block = min(since_line // index.STEP, len(index.offsets) - 1)
                offset = index.offsets[block]
            number = block * index.STEP
            found: list[StoredLine] = []
            budget = self.READ_BYTES
            while len(found) < limit and budget > 0 and offset < size:
                handle.seek(offset)
                chunk = handle.read(min(index.chunk, size - offset))
                if not chunk:
                    break
                at_end = offset + len(chunk) >= size
                pieces, ends = split_pieces(chunk, final=final and at_end, limit=self.limit)
                if not pieces:
                    break  # a line still being written gets its number once complete
                for piece in pieces:
                    number += 1
                    if number <= since_line:
                        continue
                    found.append(StoredLine(number, self.rank, decode(piece)))
                    budget -= len(piece) + 1
                    if len(found) >= limit or budget <= 0:
                        break
                else:
                    offset += ends[-1]
            if truncated and offset >= size and len(found) < limit and budget > 0:
                number += 1  # the line that says so
                if number > since_line:
                    found.append(StoredLine(number, self.rank, truncation_line(size)))
            return found


class LogSpool:
    """The numbered store of a job whose backend doesn't number its log (several ranks,
    sources that come and go): JSON lines `[attempt, rank, text]` appended in the order
    the console read them, plus how many lines of each source (e.g. a pod's log,
    `LogSource.key`) it holds, so a later read of a pod's log appends only what is new.
    Appends hold an exclusive file lock (the web process, a worker and the follower may
    all append).

    A text longer than `MAX_LINE_BYTES` characters is stored as pieces of at most that
    many (sources that split by jobs.logs.lines never send one), so a row is at most
    `ROW_BYTES`. Once the spool holds `JOB_LOG_MAX_BYTES`, one row says the log was
    truncated there and later lines are counted as read but not stored."""

    ROW_BYTES = 1 << 20  # a row of MAX_LINE_BYTES characters, JSON-escaped, fits

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
            rows: list[str] = []
            cap = log_cap()
            try:
                room = cap - self.path.stat().st_size
            except FileNotFoundError:
                room = cap
            truncated = (self.directory / "truncated").exists()
            changed = False
            for source, first, texts in batches:
                have = counts.get(source.key, 0)
                if first > have:
                    # A gap would renumber nothing but lose lines: never append past one.
                    log.warning("log of %s: lines %d… offered, %d held", source.key, first, have)
                    continue
                fresh = texts[have - first :]
                counts[source.key] = have + len(fresh)
                changed = changed or bool(fresh)
                for text in fresh:
                    for start in range(0, max(len(text), 1), MAX_LINE_BYTES):
                        if truncated:
                            break
                        row = json.dumps(
                            [attempt, source.rank, text[start : start + MAX_LINE_BYTES]]
                        )
                        room -= len(row.encode()) + 1
                        if room < 0:
                            truncated = True
                            row = json.dumps([attempt, source.rank, truncation_line(cap)])
                        rows.append(row + "\n")
            if changed:
                with open(self.path, "a", encoding="utf-8") as spool:
                    spool.writelines(rows)
                if truncated:  # after the line that says so is written
                    (self.directory / "truncated").touch()
                tmp = self.counts_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(counts))
                tmp.replace(self.counts_path)
            return len(rows)

    def _rows(self) -> FileLog:
        return FileLog(self.path, limit=self.ROW_BYTES, capped=False)

    def count(self, final: bool = False) -> int:
        return self._rows().count()

    def read(self, since_line: int, limit: int, final: bool = False) -> list[StoredLine]:
        lines = []
        for stored in self._rows().read(since_line, limit):
            _attempt, rank, text = json.loads(stored.text)
            lines.append(StoredLine(stored.line_no, rank, text))
        return lines


def spool_dir(job: Job) -> Path:
    return Path(settings.DATA_DIR) / "logs" / str(job.pk)


def spool_sync(job: Job, backend: ComputeBackend) -> int:
    """Append what the job's log sources printed since the spool's last read (one read of
    each, no waiting); returns lines added. An unreachable backend adds nothing."""
    spool = LogSpool(spool_dir(job))
    try:
        held = spool.counts()
        batches = []
        for source in backend.log_sources(job):
            skip = held.get(source.key, 0)
            stream = backend.open_log(job, source, skip=skip, follow=False)
            batches.append((source, skip, stream.poll()))
    except (BackendUnavailable, BackendRejected) as error:
        log.warning("reading the logs of job %s failed: %s", job.pk, error)
        return 0
    return spool.append(job.attempt, batches)
