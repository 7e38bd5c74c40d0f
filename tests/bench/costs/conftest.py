"""Benchmarks live in `bench_*.py` files, which the default run (`make test`, i.e. pytest
over `tests`) never collects: they are collected only when pytest is pointed at
`tests/bench` or below (`make bench`), or when GPUGEEK_BENCH=1. They print figures and
assert nothing about time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marketplace.demo import seed_catalog
from tests.conftest import make_world

BENCH_ROOT = Path(__file__).resolve().parent.parent


def benchmarks_asked_for(config: pytest.Config) -> bool:
    if os.environ.get("GPUGEEK_BENCH") == "1":
        return True
    invocation = config.invocation_params
    for arg in invocation.args:
        if arg.startswith("-"):
            continue
        path = (Path(invocation.dir) / arg.split("::")[0]).resolve()
        if path == BENCH_ROOT or BENCH_ROOT in path.parents:
            return True
    return False


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if (
        file_path.suffix == ".py"
        and file_path.name.startswith("bench_")
        and not parent.session.isinitpath(file_path)  # pytest collects a named file itself
        and benchmarks_asked_for(parent.config)
    ):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def _world():
    seed_catalog()
    return make_world("bench")


@pytest.fixture
def bench_world(db):
    """A tenant and the demo catalog (its Kubernetes pools stand in for a cluster)."""
    return _world()


@pytest.fixture
def committed_bench_world(transactional_db):
    """`bench_world` in a database whose transactions really commit, as production's do
    (emptied afterwards)."""
    return _world()
