"""Copying an opened fill source into a volume's folder: within the volume's free space,
into a staging folder first, so that the volume gains the files only when every byte
arrived (a failed or cancelled fill leaves nothing behind)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from storage.fill_sources import FillError, OpenSource

GIB = 1 << 30
STAGING_PREFIX = ".gpugeek-fill-"
# Progress is written at most this often (a row update each time).
PROGRESS_EVERY_SECONDS = 0.5


class FillCancelled(Exception):
    """The fill's row says it was cancelled meanwhile."""


def used_bytes(folder: Path) -> int:
    """Bytes the volume's files hold, without fills' staging folders."""
    total = 0
    for directory, subdirectories, files in os.walk(folder):
        if Path(directory) == folder:
            subdirectories[:] = [d for d in subdirectories if not d.startswith(STAGING_PREFIX)]
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue  # removed meanwhile
    return total


def staging_folder(folder: Path, fill_id: int, attempt: int) -> Path:
    return folder / f"{STAGING_PREFIX}{int(fill_id)}-{int(attempt)}"


def _discard(staging: Path) -> None:
    if staging.is_symlink():  # planted by a job: remove the link, not what it names
        staging.unlink()
    shutil.rmtree(staging, ignore_errors=True)


def discard_staging(folder: Path, fill_id: int, attempt: int) -> None:
    """Remove the fill's staging folder of `attempt`."""
    _discard(staging_folder(folder, fill_id, attempt))


def copy_into(
    *,
    folder: Path,
    fill_id: int,
    attempt: int = 1,
    size_gib: int,
    opened: OpenSource,
    progress: Callable[[int, int, int | None], bool],
) -> tuple[int, int]:
    """Copy every file of `opened` into `folder`; returns (bytes, files). `progress`
    (bytes, files, total) says False when the fill was cancelled. FillError when the
    volume would overflow or the source fails; the staging folder is removed then.
    Earlier staging folders go first: their runs died, were superseded or stopped."""
    free = size_gib * GIB - used_bytes(folder)
    if opened.total is not None and opened.total > free:
        raise FillError(
            f"The source holds {opened.total:,} bytes; the volume has {max(free, 0):,} bytes "
            f"free of {size_gib} GiB. Grow the volume first."
        )
    staging = staging_folder(folder, fill_id, attempt)
    # A rerun after a worker died starts again, and what a stopped copy left (a fill
    # cancelled on a cluster is stopped by deleting its pod) goes: one fill at a time.
    for stale in folder.glob(f"{STAGING_PREFIX}*"):
        _discard(stale)
    staging.mkdir(mode=0o770)
    done = files = 0
    last_report = time.monotonic()
    try:
        for relative, chunks in opened.files:
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as out:
                for chunk in chunks:
                    done += len(chunk)
                    if done > free:
                        raise FillError(
                            f"The volume is full: the copy passed its {max(free, 0):,} free "
                            f"bytes (of {size_gib} GiB) at {relative}. Grow the volume first."
                        )
                    out.write(chunk)
                    if time.monotonic() - last_report >= PROGRESS_EVERY_SECONDS:
                        last_report = time.monotonic()
                        if not progress(done, files, opened.total):
                            raise FillCancelled
            files += 1
        if not progress(done, files, opened.total):
            raise FillCancelled
        _move_into_place(staging, folder)
    finally:
        opened.close()
        discard_staging(folder, fill_id, attempt)  # never a newer attempt's folder
    return done, files


def _move_into_place(staging: Path, folder: Path) -> None:
    """Each copied file replaces the volume's file of that path, others stay (renames
    within one filesystem: each file is whole or absent)."""
    for directory, _subdirectories, files in os.walk(staging):
        for name in files:
            source = Path(directory) / name
            target = folder / source.relative_to(staging)
            # A job may have left a symlink in the volume: never follow one out of it
            # (the worker would write wherever it points).
            if not target.parent.resolve().is_relative_to(folder.resolve()):
                raise FillError(
                    f"{target.relative_to(folder)} would be written through a link that "
                    "leaves the volume; remove that link first."
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(source, target)
