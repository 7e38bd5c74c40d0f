"""Static files storage: WhiteNoise's hashed, pre-compressed files, each compressed once.

WhiteNoise recompresses every file at every `collectstatic`; Brotli at its best quality
takes about 40 s for our static tree (Plotly, the API docs' bundles), which the launcher
and each test session would pay at every start. A compressed sibling newer than its file
is already right and is kept. The plain names stay too: the error pages name them
(they must render even where the manifest can't be read).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from whitenoise.compress import brotli_installed
from whitenoise.storage import CompressedManifestStaticFilesStorage


class CompressedOnceManifestStorage(CompressedManifestStaticFilesStorage):
    def compress_files(self, paths: Iterable[str]) -> Iterator[tuple[str, str]]:
        suffixes = (".gz", ".br") if brotli_installed else (".gz",)
        # Django re-saves some hashed files at every run (those it rewrites, such as JS
        # naming a source map), so their mtime says nothing: their name is their content.
        hashed = set(self.hashed_files.values())
        yield from super().compress_files(
            [path for path in paths if not self._compressed(path, suffixes, path in hashed)]
        )

    def _compressed(self, path: str, suffixes: tuple[str, ...], hashed: bool) -> bool:
        full_path = self.path(path)
        changed = os.path.getmtime(full_path)
        for suffix in suffixes:
            try:
                compressed_at = os.path.getmtime(full_path + suffix)
            except FileNotFoundError:
                return False
            # WhiteNoise gives a compressed file its source's mtime (to a float's
            # precision): older than that, a plain name's content has changed since.
            if not hashed and compressed_at < changed - 0.001:
                return False
        return True
