"""The console's settings plus the benchmark's baseline views (tests/bench/api/urls.py)."""

from console.settings import *  # noqa: F403

ROOT_URLCONF = "tests.bench.api.urls"
