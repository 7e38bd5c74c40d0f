"""Production settings: `check --deploy` is clean, and a missing secret stops the start.

Run in subprocesses: settings are read once per process, from the environment.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from tests.servers import ROOT

pytestmark = pytest.mark.integration


def _production_env(data_dir, **overrides: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY", "DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS"}
    }
    env.update(
        GPUGEEK_ENV="production",
        GPUGEEK_DATA_DIR=str(data_dir),
        SECRET_KEY=secrets.token_urlsafe(48),  # 64 characters
        # Never connected to by `check`: only parsed.
        DATABASE_URL="postgres://gpugeek:secret@db.internal:5432/gpugeek",
        REDIS_URL="redis://redis.internal:6379/0",
        ALLOWED_HOSTS="console.example.com",
    )
    env.update(overrides)
    # Set by the browser tests' conftest for Playwright; never part of a deployment.
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return env


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_deploy_is_clean_in_production(tmp_path):
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=_production_env(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "System check identified no issues" in output
    assert "WARNINGS" not in output and "ERRORS" not in output


def test_production_without_secret_key_refuses_to_start(tmp_path):
    env = _production_env(tmp_path)
    del env["SECRET_KEY"]
    result = _manage("check", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr
    assert "ImproperlyConfigured" in result.stderr
    # No key was generated in its place.
    assert not (tmp_path / "secret_key").exists()
