"""The queue benchmark is a `bench_*.py` file, collected by the same rule as the others."""

from tests.bench.costs.conftest import pytest_collect_file  # noqa: F401
