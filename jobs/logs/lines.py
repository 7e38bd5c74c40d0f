"""How raw log bytes become numbered lines, the one rule every reader of a job's log
shares (the file store, the local stream, the pod log stream), so their numbers agree.

A line longer than `MAX_LINE_BYTES` is split into pieces, each numbered as a line:

- a piece ends at a newline within `MAX_LINE_BYTES` bytes (the newline is not part of it);
- otherwise it is cut after `MAX_LINE_BYTES` bytes, moved back (at most 3 bytes) to the
  start of a UTF-8 character, so a piece decodes to at most `MAX_LINE_BYTES` characters;
- the unfinished last piece (no newline yet, not too long yet) counts only once the log
  is final, as its text may still grow.

Deciding that a piece is cut needs `MAX_LINE_BYTES + 1` bytes in view (the next byte may
be its newline), so readers feed at least that much at once.

A job's stored log is capped at `JOB_LOG_MAX_BYTES`: bytes past the cap are never read;
once a log has grown past it, its text up to the cap is final (the last piece counts at
once) and one more line, `truncation_line(cap)`, ends it.
"""

from __future__ import annotations

from itertools import accumulate

from django.conf import settings

MAX_LINE_BYTES = 65536


def truncation_line(cap: int) -> str:
    return f"[log truncated at {cap} bytes]"


def log_cap() -> int:
    """The most bytes of a job's log that are stored and read (`JOB_LOG_MAX_BYTES`)."""
    return int(getattr(settings, "JOB_LOG_MAX_BYTES", 1 << 30))


def _cut(part: bytes, limit: int) -> tuple[list[bytes], bytes]:
    """Cut pieces off `part` while more than `limit` bytes remain; returns them and the
    rest (at most `limit` bytes)."""
    pieces = []
    start = 0
    while len(part) - start > limit:
        cut = start + limit
        # Back to a character's first byte (10xxxxxx continues one), at most 3 steps.
        while cut > start + limit - 3 and part[cut] & 0xC0 == 0x80:
            cut -= 1
        pieces.append(part[start:cut])
        start = cut
    return pieces, part[start:]


def split_pieces(
    data: bytes, *, final: bool = False, limit: int = MAX_LINE_BYTES
) -> tuple[list[bytes], list[int]]:
    """The pieces of `data` (which starts where a piece starts) and, for each, the offset
    in `data` just after it (after its newline, if it has one). `ends[-1]` (0 if none) is
    where the rest starts: a partial piece, kept unless `final`."""
    last = data.rfind(b"\n")
    parts = data[:last].split(b"\n") if last >= 0 else []
    if parts and max(map(len, parts)) <= limit:  # the usual case: no long line
        pieces = parts
        ends = list(accumulate(len(part) + 1 for part in parts))
    else:
        pieces, ends, at = [], [], 0
        for part in parts:
            cuts, rest = _cut(part, limit)
            for piece in cuts:
                at += len(piece)
                pieces.append(piece)
                ends.append(at)
            at += len(rest) + 1
            pieces.append(rest)
            ends.append(at)
    tail = data[last + 1 :]
    if tail:
        at = last + 1
        cuts, rest = _cut(tail, limit)
        if final and rest:
            cuts.append(rest)
        for piece in cuts:
            at += len(piece)
            pieces.append(piece)
            ends.append(at)
    return pieces, ends


def decode(piece: bytes) -> str:
    return piece.decode(errors="replace").rstrip("\r")


class LineSplitter:
    """Pieces of a byte stream fed in parts (a socket, a growing file): `feed` returns the
    complete pieces so far, `finish` the partial last one (the stream has ended). Holds at
    most `limit` bytes between calls."""

    def __init__(self, limit: int = MAX_LINE_BYTES):
        self.limit = limit
        self.pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        buffer = self.pending + data if self.pending else data
        pieces, ends = split_pieces(buffer, limit=self.limit)
        self.pending = buffer[ends[-1] :] if ends else buffer
        return pieces

    def finish(self) -> list[bytes]:
        rest, self.pending = self.pending, b""
        return [rest] if rest else []
