"""Launch benchmark (issue 16): `POST /api/v1/jobs` from 16 concurrent clients against
the production topology (uvicorn with 2 workers, PostgreSQL, Redis as the broker), loaded
by `wrk` (or a Python asyncio client) from outside the server's processes.

Each request is a whole launch: validation, the launch policies, one transaction that
records the job, its event and audit entry and admits it (or queues it once its pool is
full), and its dispatch task queued after commit (nobody consumes those here: the
dispatch benchmarks measure that side). Prints launches/s with p50 and p99 and records
them for `make bench`; asserts only that every launch was accepted (201) and stored.

    DATABASE_URL=postgres://… .venv/bin/python -m pytest tests/bench/api/bench_launch.py -s
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from console.services.tokens import api_token_create
from jobs.models import Job
from marketplace.demo import seed_catalog
from tests.bench.api.bench_api import SECONDS, WARMUP, WORKERS, uvicorn_server
from tests.bench.api.load import load
from tests.bench.dispatch.bench_dispatch import LAUNCH
from tests.bench.results import record
from tests.conftest import make_world
from tests.servers import purge_queues

pytestmark = pytest.mark.timeout(900)

CLIENTS = 16


def test_concurrent_launches(transactional_db, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the launch benchmark measures the production topology: set DATABASE_URL")
    seed_catalog()  # the demo pools are Kubernetes pools: launches are accepted and admitted
    world = make_world("launch")
    _, raw = api_token_create(user=world.owner, tenant=world.tenant, name="bench")
    headers = {"Authorization": f"Bearer {raw}", "Content-Type": "application/json"}
    purge_queues()
    try:
        with uvicorn_server(tmp_path, COMPUTE_BACKENDS="kubernetes") as server:
            figure = load(
                f"{server}/api/v1/jobs",
                headers,
                seconds=SECONDS,
                warmup=WARMUP,
                connections=CLIENTS,
                body=json.dumps({**LAUNCH, "name": "bench-launch"}).encode(),
            )
    finally:
        purge_queues()  # the dispatch tasks the launches queued

    launched = Job.objects.filter(tenant=world.tenant).count()
    print(
        f"\nlaunches ({figure.tool}, {CLIENTS} clients, {SECONDS}s after {WARMUP}s warm-up, "
        f"uvicorn × {WORKERS}): {figure.requests_per_second:.1f}/s, p50 {figure.p50_ms:.1f} ms, "
        f"p99 {figure.p99_ms:.1f} ms; {launched:,} jobs stored"
    )
    record(
        "launch",
        f"POST /api/v1/jobs, {CLIENTS} concurrent clients (p50 {figure.p50_ms:.0f} ms, "
        f"p99 {figure.p99_ms:.0f} ms)",
        figure.requests_per_second,
        "launches/s",
        target="≥ 100 launches/s",
        met=figure.requests_per_second >= 100,
    )
    assert figure.errors == 0, f"{figure.errors} launches were not accepted"
    assert launched >= figure.requests_per_second * SECONDS * 0.5  # every accepted one stored
