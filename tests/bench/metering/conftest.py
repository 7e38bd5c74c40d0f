"""Benchmarks live in `bench_*.py` files, which the default run (`make test`, i.e. pytest
over `tests`) never collects: they are collected only when pytest is pointed at
`tests/bench` or below (`make bench`), or when GPUGEEK_BENCH=1. They print figures and
assert nothing about time."""

from __future__ import annotations

from tests.bench.costs.conftest import (  # noqa: F401  (the same rule for both folders)
    bench_world,
    committed_bench_world,
    pytest_collect_file,
)
