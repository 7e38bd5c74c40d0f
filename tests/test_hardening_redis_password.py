"""Issue 13: the embedded Redis requires a password (random, made at first start, kept
0600 in the data dir, given on stdin: never in argv, never printed)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings

from console.env import embedded_redis_url_file
from console.launcher import ConsoleLauncher, redacted_url
from console.management.commands import runconsole


def _refuses_without_password(url: str) -> None:
    parts = urlsplit(url)
    anonymous = redis.Redis(host=parts.hostname, port=parts.port, socket_timeout=5)
    try:
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
    finally:
        anonymous.close()
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        assert client.ping()
    finally:
        client.close()


def test_the_test_sessions_redis_refuses_clients_without_the_password():
    if not urlsplit(settings.REDIS_URL).password:
        pytest.skip("REDIS_URL was given from outside this session (not the embedded one)")
    _refuses_without_password(settings.REDIS_URL)


def test_the_launchers_redis_has_a_kept_private_password_never_in_argv(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    launcher = ConsoleLauncher(
        base_dir=settings.BASE_DIR,
        data_dir=data_dir,
        host="127.0.0.1",
        port=0,
        worker_concurrency=1,
    )
    try:
        url = launcher.start_embedded_redis()
        password = urlsplit(url).password
        assert password and len(password) >= 32
        _refuses_without_password(url)
        password_file = data_dir / "redis" / "redis-password"
        url_file = embedded_redis_url_file(data_dir)
        assert password_file.read_text() == password
        assert url_file.read_text() == url
        for path in (password_file, url_file):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE((data_dir / "redis").stat().st_mode) == 0o700
        pid = launcher.redis.process.pid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert password not in argv
        assert password not in (data_dir / "redis" / "redis.log").read_text()
        assert password not in redacted_url(url) and "***" in redacted_url(url)
    finally:
        launcher.stop()
    # The next start keeps the same password.
    again = ConsoleLauncher(
        base_dir=settings.BASE_DIR,
        data_dir=data_dir,
        host="127.0.0.1",
        port=0,
        worker_concurrency=1,
    )
    try:
        assert urlsplit(again.start_embedded_redis()).password == password
    finally:
        again.stop()


def test_runconsole_prints_the_redis_url_without_its_password(monkeypatch, tmp_path):
    printed = []

    class Launcher(ConsoleLauncher):
        def run(self, env):
            printed.append(env["REDIS_URL"])
            self.stop()
            return 0

    monkeypatch.setattr(runconsole, "ConsoleLauncher", Launcher)
    monkeypatch.setattr(runconsole, "call_command", lambda *a, **k: None)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(settings, "DATA_DIR", tmp_path)
    monkeypatch.setattr(settings, "SANDBOX_CLUSTER", False)  # Redis only, no database here
    from io import StringIO

    out = StringIO()
    command = runconsole.Command(stdout=out)
    with pytest.raises(SystemExit):
        command.handle(host="127.0.0.1", port=0, no_seed=True, worker_concurrency=1)
    password = urlsplit(printed[0]).password
    assert password and password not in out.getvalue()
    assert "Embedded Redis at redis://:***@127.0.0.1:" in out.getvalue()
    assert os.environ.get("REDIS_URL") is None or password not in os.environ["REDIS_URL"]
