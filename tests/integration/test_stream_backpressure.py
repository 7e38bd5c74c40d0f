"""Slow readers of a job's log on the real ASGI server (uvicorn, as `runconsole` and the
production image run it): the download (`log.txt`) and the NDJSON stream
read the next piece of the log only once the last one was sent, so a client that stops
reading costs the server a bounded amount of memory, whatever the log's size, and a
normal reader still gets every byte."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import httpx
import psutil
import pytest
from django.conf import settings

from console.services.tokens import api_token_create
from jobs.models import JobStatus
from tests.jobs.test_consumers import make_job
from tests.servers import wait_until

pytestmark = pytest.mark.integration

LINE_BYTES = 4096
LOG_LINES = 32768  # 128 MiB: past any socket buffer, twice the bound below
# What one stalled client may cost the server, above its warmed-up size: the log is 4×
# that; a stream's own window (a piece being read, a few waiting) is a fraction of it.
GROWTH_BOUND = 32 << 20


def write_log(job, lines: int = LOG_LINES) -> str:
    """`lines` numbered lines of LINE_BYTES in the job's output file (the local backend's
    log store); returns the file's sha256."""
    path = Path(settings.DATA_DIR) / "jobs" / str(job.pk) / "output.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    filler = "x" * (LINE_BYTES - 10)
    with path.open("wb") as handle:
        for start in range(1, lines + 1, 1024):
            block = "".join(
                f"{n:08d} {filler}\n" for n in range(start, min(start + 1024, lines + 1))
            ).encode()
            digest.update(block)
            handle.write(block)
    return digest.hexdigest()


class ServerMemory:
    """The ASGI server's resident memory, read once it has settled: no CPU spent over a
    few consecutive samples (it finished what it could do, or waits for its client)."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.peak = 0

    def _cpu(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    def settled(self, timeout: float = 180) -> int:
        quiet = 0
        last = self._cpu()

        def idle() -> bool:
            nonlocal quiet, last
            self.peak = max(self.peak, self.process.memory_info().rss)
            now = self._cpu()
            quiet = quiet + 1 if now - last < 0.02 else 0
            last = now
            return quiet >= 4

        wait_until(idle, timeout, interval=0.5, what="the ASGI server to settle")
        return self.process.memory_info().rss


def stalled_request(port: int, path: str, token: str) -> socket.socket:
    """A GET whose response headers are read, and then nothing more (the server closes
    the connection once it has sent the response)."""
    client = socket.create_connection(("127.0.0.1", port), timeout=30)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    client.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = client.recv(1024)
        assert chunk, f"no response to {path}"
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return client


def read_download(client: httpx.Client, path: str) -> str:
    digest = hashlib.sha256()
    with client.stream("GET", path) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            digest.update(chunk)
    return digest.hexdigest()


def read_stream(client: httpx.Client, path: str) -> tuple[list[int], dict]:
    """Every line number the NDJSON stream sent (first characters of each text checked),
    and its last object."""
    numbers: list[int] = []
    last: dict = {}
    with client.stream("GET", path) as response:
        assert response.status_code == 200
        for raw in response.iter_lines():
            last = json.loads(raw)
            for line in last.get("lines", ()):
                assert line["text"].startswith(f"{line['line_no']:08d} x")
                assert len(line["text"]) == LINE_BYTES - 1
                numbers.append(line["line_no"])
    return numbers, last


@pytest.mark.parametrize("endpoint", ["log.txt", "logs/stream"])
def test_a_client_that_reads_nothing_costs_the_server_bounded_memory(
    asgi_server, transactional_db, world, catalog, endpoint
):
    server = asgi_server
    _, token = api_token_create(user=world.member, tenant=world.tenant, name="slow")
    small = make_job(world.tenant, status=JobStatus.SUCCEEDED)
    job = make_job(world.tenant, status=JobStatus.SUCCEEDED)
    write_log(small, lines=1000)
    sha256 = write_log(job)
    path = f"/api/v1/jobs/{job.pk}/{endpoint}"
    memory = ServerMemory(server.process.pid)

    # Warm up (imports, first allocations, the log's line index) with a normal reader.
    warm = stalled_request(server.port, f"/api/v1/jobs/{small.pk}/{endpoint}", token)
    while warm.recv(1 << 20):
        pass
    warm.close()
    baseline = memory.settled()
    memory.peak = 0

    stalled = stalled_request(server.port, path, token)
    held = memory.settled()
    growth = max(held, memory.peak) - baseline
    stalled.close()
    after_close = memory.settled()
    print(
        f"{endpoint}: baseline {baseline >> 20} MiB, "
        f"stalled reader +{growth >> 20} MiB, after close +{(after_close - baseline) >> 20} MiB"
    )
    assert growth < GROWTH_BOUND, f"+{growth >> 20} MiB for a client reading nothing"
    assert after_close - baseline < GROWTH_BOUND

    # A normal reader gets the whole log, every line once, in order; its connection is
    # kept alive for a next request.
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        if endpoint == "log.txt":
            assert read_download(client, path) == sha256
        else:
            numbers, last = read_stream(client, path)
            assert numbers == list(range(1, LOG_LINES + 1))
            assert last == {"type": "end", "status": "succeeded", "last_line": LOG_LINES}
        again = client.get(f"/api/v1/jobs/{small.pk}/log.txt")
        assert again.status_code == 200 and len(again.content) == 1000 * LINE_BYTES
    assert "Traceback" not in server.log()
    # Settled again: nothing left running for the closed or finished streams.
    assert memory.settled() - baseline < GROWTH_BOUND
