"""Typed readers for the environment variables that configure GpuGeek.

Kept free of Django imports so settings.py, the launcher and the test plugin can use them.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {value!r}")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def data_dir() -> Path:
    """Everything the embedded default writes lives here (GPUGEEK_DATA_DIR, default ./var)."""
    path = Path(os.environ.get("GPUGEEK_DATA_DIR", "var")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def embedded_redis_url_file(base: Path) -> Path:
    """Where the launcher publishes the embedded Redis's URL while it runs."""
    return base / "redis" / "redis.url"


def stored_secret_key(base: Path) -> str:
    """Generate the secret key once per data dir and reuse it on every later start."""
    key_file = base / "secret_key"
    if key_file.exists():
        return key_file.read_text().strip()
    key = secrets.token_urlsafe(64)
    # O_EXCL: two processes starting at once must agree on one key.
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return key_file.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key
