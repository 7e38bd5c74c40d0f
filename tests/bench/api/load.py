"""HTTP load from outside the server's processes: `wrk` (Debian's package) when it is
installed, else a Python asyncio client with the same shape (N connections, each sending
its next request when the last answer arrives)."""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


@dataclass
class Load:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    errors: int
    tool: str


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"unreadable wrk latency {text!r}")
    return float(match[1]) * UNITS[match[2]]


def with_wrk(
    url: str, headers: dict[str, str], seconds: float, connections: int, body: bytes | None
) -> Load:
    # A slow answer is a slow answer, not a failed one: wrk's default 2 s socket timeout
    # turned a loaded machine's slow launches into "errors" (the latencies show them).
    argv = ["wrk", "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    argv += ["--timeout", "10s"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    with tempfile.TemporaryDirectory() as directory:
        if body is not None:  # every request the same POST (wrk's scripting)
            script = Path(directory) / "post.lua"
            script.write_text(f'wrk.method = "POST"\nwrk.body = [==[{body.decode()}]==]\n')
            argv += ["-s", str(script)]
        out = subprocess.run(
            [*argv, url], capture_output=True, text=True, timeout=seconds + 60, check=True
        ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out)[1])
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out)[1])
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*?timeout (\d+)", out)
    return Load(
        rate, p50, p99, (int(bad[1]) if bad else 0) + (int(errors[1]) if errors else 0), "wrk"
    )


def with_python(
    url: str, headers: dict[str, str], seconds: float, connections: int, body: bytes | None
) -> Load:
    async def main() -> Load:
        latencies: list[float] = []
        errors = 0
        deadline = time.monotonic() + seconds
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as client:

            async def one_connection() -> None:
                nonlocal errors
                while time.monotonic() < deadline:
                    started = time.perf_counter()
                    if body is None:
                        response = await client.get(url)
                    else:
                        response = await client.post(url, content=body)
                    latencies.append((time.perf_counter() - started) * 1000)
                    errors += response.status_code >= 300

            began = time.monotonic()
            await asyncio.gather(*(one_connection() for _ in range(connections)))
            elapsed = time.monotonic() - began
        cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0] * 99
        return Load(len(latencies) / elapsed, cuts[49], cuts[98], errors, "python")

    return asyncio.run(main())


def load(
    url: str,
    headers: dict[str, str] | None = None,
    *,
    seconds: float,
    warmup: float,
    connections: int = 16,
    body: bytes | None = None,
) -> Load:
    """GETs of `url`, or POSTs of `body` when one is given."""
    run = with_wrk if shutil.which("wrk") else with_python
    if warmup:
        run(url, headers or {}, warmup, connections, body)
    return run(url, headers or {}, seconds, connections, body)
