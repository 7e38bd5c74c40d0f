"""Archived log range reads: what `GET /api/v1/jobs/<id>/logs?since_line=N&limit=M` costs on a
finished job's archive, indexed (gzip members + offsets) against the format before the
index (one gzip stream, decompressed whole on the first read). Prints figures; asserts
only that both formats return the same lines. Full size: 1,000,000 lines."""

from __future__ import annotations

import gzip
import json
import time

from jobs.logs.archive import ArchiveLog, write_archive
from tests.bench.streaming.test_streaming import full_size


def _clear_caches() -> None:
    ArchiveLog._cache.clear()
    ArchiveLog._indexes.clear()
    ArchiveLog._members.clear()


def _timed(store: ArchiveLog, since: int, limit: int) -> tuple[float, list]:
    started = time.perf_counter()
    lines = store.read(since, limit)
    return (time.perf_counter() - started) * 1000, lines


def test_archive_range_read_benchmark(tmp_path, request):
    total = 1_000_000 if full_size(request.config) else 100_000
    text = "step {n} loss={loss:.6f} lr=3e-4 tokens/s=81234"
    rows = ((n % 4, text.format(n=n, loss=1 / n)) for n in range(1, total + 1))
    indexed = tmp_path / "indexed.jsonl.gz"
    started = time.perf_counter()
    write_archive(indexed, rows)
    write_s = time.perf_counter() - started
    legacy = tmp_path / "legacy.jsonl.gz"
    with gzip.open(legacy, "wt", encoding="utf-8", compresslevel=6) as handle:
        handle.writelines(
            json.dumps([n % 4, f"step {n} loss={1 / n:.6f} lr=3e-4 tokens/s=81234"]) + "\n"
            for n in range(1, total + 1)
        )

    figures = {}
    for name, path in (("indexed", indexed), ("whole (old)", legacy)):
        _clear_caches()
        store = ArchiveLog(path)
        cold_ms, first = _timed(store, total // 2, 500)  # a cold read in the middle
        # Scrolling up from the end: 40 pages of 500 lines, each fetched by range.
        started = time.perf_counter()
        since = total
        pages = []
        for _ in range(40):
            since = max(0, since - 500)
            pages.append(store.read(since, 500))
        scroll_ms = (time.perf_counter() - started) * 1000 / 40
        _clear_caches()
        last_ms, last = _timed(ArchiveLog(path), total - 100, 500)
        figures[name] = (cold_ms, scroll_ms, last_ms, path.stat().st_size, first, pages, last)

    a, b = figures["indexed"], figures["whole (old)"]
    assert [ln.text for ln in a[4]] == [ln.text for ln in b[4]]
    assert [ln.line_no for p in a[5] for ln in p] == [ln.line_no for p in b[5] for ln in p]
    assert len(a[6]) == len(b[6]) == 100
    print(
        f"\narchive range reads, {total:,} lines (write of the indexed archive {write_s:.1f} s)"
        "\nformat        size MiB  cold read 500 lines ms  scroll-up page ms  last page cold ms"
    )
    for name, (cold, scroll, last_ms, size, *_rest) in figures.items():
        print(f"{name:<12} {size / 2**20:>9.1f}  {cold:>22.1f}  {scroll:>17.2f}  {last_ms:>17.1f}")
