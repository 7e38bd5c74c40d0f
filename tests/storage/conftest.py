"""Fixtures shared by the storage tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def fill_settings(settings, tmp_path):
    """Volumes in a temporary folder; fills run by the worker's service directly, from
    test servers on 127.0.0.1."""
    settings.LOCAL_VOLUME_DIR = str(tmp_path / "volumes")
    settings.LOCAL_JOB_SANDBOX = False  # the fill needs no sandbox: the worker writes
    settings.VOLUME_FILL_ALLOW_PRIVATE_HOSTS = True  # the test servers are on 127.0.0.1
    return settings
