"""The CLI's stored login: ~/.config/gpugeek/config.json (mode 0600)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpugeek" / "config.json"


def load() -> dict[str, str]:
    try:
        return json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}


def save(url: str, token: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"url": url, "token": token}, handle)
    os.chmod(path, 0o600)
    return path
