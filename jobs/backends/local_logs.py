"""A local job's output file read as a log stream (`jobs.backends.base.LogStream`)."""

from __future__ import annotations

import os
from pathlib import Path

from jobs.backends.base import LogSource
from jobs.logs.lines import LineSplitter, decode, log_cap, split_pieces, truncation_line

# Written by the supervisor once a run has ended: after its last output, or instead of
# starting a job that was stopped first.
END_MARKERS = ("exit_code", "not_started")


def run_ended(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in END_MARKERS)


class LocalLogStream:
    """A local job's output file after its first `skip` lines (`jobs.backends.base.LogStream`).

    Each poll reads the bytes written since the last one (at most `POLL_BYTES`, the rest
    on the next polls) on an open handle and returns the complete lines, split and capped
    as jobs.logs.lines says; a last line without its newline counts once the job has ended
    (the supervisor wrote `exit_code` or `not_started`), as in the console's numbering of
    the file. A followed stream never ends by itself: a resumed job writes to the same
    file."""

    CHUNK = 1 << 20
    POLL_BYTES = 4 << 20  # read per poll at most: a flood is returned over several polls

    def __init__(self, run_dir: Path, source: LogSource, *, skip: int = 0, follow: bool = True):
        self.path = run_dir / source.key
        self.run_dir = run_dir
        self.source = source
        self.skip = skip
        self.follow = follow
        self.handle = None
        self.splitter = LineSplitter()
        self.offset = 0  # bytes of the file read so far
        self.cap = log_cap()
        self.truncated = False
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    def _open(self) -> bool:
        try:
            self.handle = open(self.path, "rb")  # noqa: SIM115 (kept open while followed)
        except FileNotFoundError:
            return False
        # Move past the first `skip` lines (pieces, see jobs.logs.lines), in bounded reads.
        # With fewer so far, stop after the last complete one and skip the rest from the
        # lines still to come.
        skipped = 0
        while skipped < self.skip and self.offset < self.cap:
            data = self.handle.read(min(self.CHUNK, self.cap - self.offset))
            _pieces, ends = split_pieces(data)
            if skipped + len(ends) >= self.skip:
                self.offset += ends[self.skip - skipped - 1]
                skipped = self.skip
                break
            skipped += len(ends)
            self.offset += ends[-1] if ends else 0
            if len(data) < self.CHUNK or not ends:
                break
            self.handle.seek(self.offset)
        self.handle.seek(self.offset)
        self.skip -= skipped
        return True

    def poll(self) -> list[str]:
        if self._ended:
            return []
        if self.handle is None and not self._open():
            self._ended = not self.follow
            return []
        raws, at_end = self._read()
        if at_end and (not raws or not self.follow):
            # Nothing new (or a snapshot): once the job has ended, a partial line is final.
            # `exit_code` is written after the job's last output, so checking it first and
            # then reading again misses nothing.
            if run_ended(self.run_dir):
                more, at_end = self._read()
                raws += more
                if at_end and not self.truncated:
                    raws += self.splitter.finish()
            self._ended = at_end and not self.follow
        if self.skip:
            dropped = min(self.skip, len(raws))
            self.skip -= dropped
            raws = raws[dropped:]
        return [decode(raw) for raw in raws]

    def _read(self) -> tuple[list[bytes], bool]:
        """Pieces written since the last read (up to `POLL_BYTES`), and whether the read
        reached the end of what there is. Past `JOB_LOG_MAX_BYTES` the log is final: the
        partial piece counts and one line says it was truncated (as in jobs.logs.stores)."""
        raws: list[bytes] = []
        if self.truncated:
            return raws, True
        budget = self.POLL_BYTES
        while budget > 0:
            room = self.cap - self.offset
            if room <= 0:
                if os.fstat(self.handle.fileno()).st_size > self.cap:
                    self.truncated = True
                    raws += self.splitter.finish()
                    raws.append(truncation_line(self.cap).encode())
                return raws, True
            data = self.handle.read(min(self.CHUNK, room))
            self.offset += len(data)
            budget -= len(data)
            raws += self.splitter.feed(data)
            if len(data) < min(self.CHUNK, room):
                return raws, True
        return raws, False

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        self._ended = True
