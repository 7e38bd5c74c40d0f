"""The copy of a volume fill on a cluster: `python -m storage.fill_pod`, run in a pod of
the tenant's namespace (the console's image) with the volume's claim mounted. It is the
same copy as on the console's host (fill_sources, fill_copy: staging folder, size
bound, whole files or none) and reports on stdout, one JSON object per line, which the
console reads from the pod's log (jobs.backends.kubernetes.fills):

    {"bytes": 1048576, "files": 0, "total": 4194304}      progress, at most twice a second
    {"done": true, "bytes": 4194304, "files": 1, "total": 4194304}   the last of a success
    {"error": "Can't read https://…: HTTP 404."}           the last line of a failure (exit 1)

What it reads comes only from its own environment (the fill's Job and Secret): never the
console's settings, database or credentials. It runs without Django's project settings:
the two the source reader needs are configured from the environment here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from django.conf import settings

from storage.fill_copy import copy_into
from storage.fill_sources import FillError, open_source, parse_source

ENV_PREFIX = "GPUGEEK_FILL_"
DEFAULT_TARGET = "/volume"


def _configure(env: Mapping[str, str]) -> None:
    if not settings.configured:
        settings.configure(
            VOLUME_FILL_ALLOW_PRIVATE_HOSTS=env.get(f"{ENV_PREFIX}ALLOW_PRIVATE_HOSTS") == "1",
            VOLUME_FILL_S3_REGION=env.get(f"{ENV_PREFIX}S3_REGION") or "us-east-1",
        )


def run(env: Mapping[str, str], out: TextIO) -> int:
    """Copy the fill named by `env` into its target folder; the exit code."""
    _configure(env)

    def say(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    def progress(done: int, files: int, total: int | None) -> bool:
        say({"bytes": done, "files": files, "total": total})
        return True  # a cancelled fill's Job is deleted, which stops this process

    try:
        source = parse_source(
            env.get(f"{ENV_PREFIX}SOURCE", ""), endpoint=env.get(f"{ENV_PREFIX}ENDPOINT", "")
        )
        opened = open_source(source, credential=env.get(f"{ENV_PREFIX}CREDENTIAL", ""))
        done, files = copy_into(
            folder=Path(env.get(f"{ENV_PREFIX}TARGET") or DEFAULT_TARGET),
            fill_id=int(env.get(f"{ENV_PREFIX}ID", "0")),
            attempt=int(env.get(f"{ENV_PREFIX}ATTEMPT", "1")),
            size_gib=int(env.get(f"{ENV_PREFIX}SIZE_GIB", "0")),
            opened=opened,
            progress=progress,
        )
    except FillError as error:
        say({"error": str(error)})
        return 1
    except OSError as error:
        say({"error": f"Writing to the volume failed: {error.strerror or error}."})
        return 1
    say({"done": True, "bytes": done, "files": files, "total": opened.total})
    return 0


if __name__ == "__main__":
    sys.exit(run(os.environ, sys.stdout))
