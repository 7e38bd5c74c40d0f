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
    """Everything the embedded default writes lives here (GPUGEEK_DATA_DIR, default ./var).

    Private to the console's user (0700): it holds the secret key, the SQLite database,
    the embedded Redis's password and the jobs' run directories, none of which a local
    job running as another user (LOCAL_JOB_USER) may open."""
    path = Path(os.environ.get("GPUGEEK_DATA_DIR", "var")).resolve()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = path.stat()
    if status.st_uid == os.geteuid() and status.st_mode & 0o077:
        path.chmod(0o700)
    return path


def embedded_redis_dir(base: Path) -> Path:
    path = base / "redis"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def embedded_redis_url_file(base: Path) -> Path:
    """Where the launcher publishes the embedded Redis's URL (with its password, 0600)
    while it runs."""
    return base / "redis" / "redis.url"


def write_private(path: Path, text: str) -> None:
    """Write a file only the console's user may read (0600 from its creation on)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _stored_secret(path: Path, make) -> str:
    if path.exists():
        return path.read_text().strip()
    value = make()
    # O_EXCL: two processes starting at once must agree on one value.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    return value


def stored_secret_key(base: Path) -> str:
    """Generate the secret key once per data dir and reuse it on every later start."""
    return _stored_secret(base / "secret_key", lambda: secrets.token_urlsafe(64))


def stored_redis_password(base: Path) -> str:
    """The embedded Redis's password: random, made at first start, kept (0600) in the
    data dir, and given to redis-server on stdin, never in its argv."""
    return _stored_secret(
        embedded_redis_dir(base) / "redis-password", lambda: secrets.token_urlsafe(32)
    )


def sandbox_dir(base: Path) -> Path:
    """The sandbox cluster's files: its nodes (editable), token and kubeconfig."""
    path = base / "sandbox"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def stored_sandbox_token(base: Path) -> str:
    """The bearer token of the sandbox cluster's API (random, made once, 0600)."""
    return _stored_secret(sandbox_dir(base) / "token", lambda: secrets.token_urlsafe(32))
