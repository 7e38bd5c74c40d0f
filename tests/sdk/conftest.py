"""The SDK and CLI against a real server: uvicorn on the test database (asgi_server),
the demo catalog, a tenant with a token. The package is imported from its source tree
(clients/python/src), no install needed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from gpugeek import Client  # noqa: E402

from console.services.tokens import api_token_create  # noqa: E402
from jobs.models import Job, JobStatus  # noqa: E402
from jobs.services import job_dispatch  # noqa: E402
from tests.servers import asgi_server, watcher_process  # noqa: E402, F401


@pytest.fixture
def api_token(world, catalog) -> str:
    _, raw = api_token_create(user=world.owner, tenant=world.tenant, name="sdk")
    return raw


@pytest.fixture
def gg(asgi_server, api_token, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GPUGEEK_URL", asgi_server.url)
    monkeypatch.setenv("GPUGEEK_TOKEN", api_token)
    client = Client(backoff=0.05)
    yield client
    client.close()


def dispatch(job_id: int, timeout: float = 20) -> None:
    """What the Celery dispatch task does (no worker runs in these tests): start the
    admitted job on its backend once admission has marked it dispatching."""
    deadline = time.monotonic() + timeout
    while True:
        job = Job.objects.get(pk=job_id)
        if job.status == JobStatus.DISPATCHING:
            job_dispatch(job=job)
            return
        if job.status != JobStatus.QUEUED or time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {job.status}: {job.status_reason}")
        time.sleep(0.2)


def cpu_spec(program: str, **extra) -> dict:
    return {
        "name": "sdk cpu job",
        "image": "python-3.11",
        "region": "local",
        "cpus": 1,
        "command": ["python", "-c", program],
        **extra,
    }


def counting_program(lines: int, *, pause_every: int, pause: float) -> str:
    """A job printing "line 1" … "line N", pausing `pause` s every `pause_every` lines
    (batches that the log follower publishes separately)."""
    return f"""
import time
for n in range(1, {lines + 1}):
    print(f"line {{n}}", flush=True)
    if n % {pause_every} == 0:
        time.sleep({pause})
"""


# A job that never ends on its own (the test cancels it).
PRINTS_FOREVER = """
import time
n = 0
while True:
    n += 1
    print(f"tick {n}", flush=True)
    time.sleep(0.1)
"""
