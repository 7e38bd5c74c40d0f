"""Static files storage: WhiteNoise's hashed, pre-compressed files, compressed once.

WhiteNoise recompresses every file at every `collectstatic`; Brotli at its best quality
takes about 40 s for our static tree (Plotly, the API docs' bundles), which the launcher
and each test session would pay at every start. A hashed name is its content, so a
compressed sibling that already exists is already right and is kept.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from whitenoise.compress import brotli_installed
from whitenoise.storage import CompressedManifestStaticFilesStorage


class CompressedOnceManifestStorage(CompressedManifestStaticFilesStorage):
    """Only hashed files are kept (templates name them through the manifest), and each
    is compressed the first time it appears."""

    keep_only_hashed_files = True

    def compress_files(self, paths: Iterable[str]) -> Iterator[tuple[str, str]]:
        suffixes = (".gz", ".br") if brotli_installed else (".gz",)
        fresh = [
            path
            for path in paths
            if not all(os.path.exists(self.path(path) + suffix) for suffix in suffixes)
        ]
        yield from super().compress_files(fresh)
