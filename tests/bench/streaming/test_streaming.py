"""Streaming benchmark: job log lines from the file a job writes to the browsers' sockets,
through the real stack (Daphne, the Redis channel layer, one log follower per job).

Prints, per scenario, p50/p99 latency from line written to line received, lines/s
delivered, the server's CPU and RSS, and lost or duplicated line numbers. It asserts
nothing about time (DESIGN.md). Sizes: `make bench` (or GPUGEEK_BENCH=full) runs the
issue's 10 jobs × 100 viewers and 100 jobs × 10 viewers at 50 lines/s per job; inside
`make test` a smoke size runs. Everything is on 127.0.0.1; the load generator and the
line writer are separate processes on the same machine as the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from tests.conftest import signed_in_client
from tests.jobs.conftest import catalog  # noqa: F401
from tests.jobs.test_consumers import make_job
from tests.servers import ROOT, asgi_server  # noqa: F401

RATE = 50  # lines per second per job
# Seconds between two sockets' connects: pages arriving, not a storm. Each handshake costs
# the server a session and a user query on Channels' one database thread (AuthMiddleware).
RAMP = 0.04
PROFILED_DAPHNE = [sys.executable, "-m", "tests.bench.streaming.profiled"]


def daphne_args(port: int) -> list[str]:
    return ["-b", "127.0.0.1", "-p", str(port), "console.asgi:application"]


FULL = [(10, 100), (100, 10)]
SMOKE = [(2, 5)]


def full_size(config) -> bool:
    """Full when asked (GPUGEEK_BENCH=full, or tests/bench named on the command line)."""
    chosen = os.environ.get("GPUGEEK_BENCH")
    if chosen in ("full", "smoke"):
        return chosen == "full"
    return any(str(arg).rstrip("/").startswith("tests/bench") for arg in config.args)


def run_scenario(server, cookie: str, job_ids: list[int], viewers: int, seconds: float) -> dict:
    files = [Path(settings.DATA_DIR) / "jobs" / str(job) / "output.log" for job in job_ids]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    config = {"ws_url": server.ws_url, "origin": server.url, "cookie": cookie}
    config.update(
        jobs=job_ids, viewers=viewers, ramp=float(os.environ.get("GPUGEEK_BENCH_RAMP", RAMP))
    )
    load = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.streaming.load", json.dumps(config)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = load.stderr.readline()
        assert line.strip() == "connected", line + load.stderr.read()
        daphne = psutil.Process(server.process.pid)
        load_process = psutil.Process(load.pid)
        cpu_before, load_before = daphne.cpu_times(), load_process.cpu_times()
        started = time.time()
        warmup = min(2.0, seconds / 4)
        writer = subprocess.run(
            [sys.executable, "-m", "tests.bench.streaming.writer", str(seconds), str(RATE)]
            + [str(f) for f in files],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        time.sleep(1.5)  # let the last batches arrive
        wall = time.time() - started
        cpu_after, load_after = daphne.cpu_times(), load_process.cpu_times()
        rss = daphne.memory_info().rss
        out, _ = load.communicate(json.dumps({"measure_from": started + warmup}), timeout=120)
    finally:
        if load.poll() is None:
            load.kill()
    results = json.loads(out)
    written = json.loads(writer.stdout)["lines_per_file"]
    sockets = results["sockets"]
    lost = sum(s["gaps"] for s in sockets) + sum(
        written - (s["last"] or 0) for s in sockets if (s["last"] or 0) < written
    )
    cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    load_cpu = (load_after.user + load_after.system) - (load_before.user + load_before.system)
    errors = sorted({s["error"] for s in sockets if s["error"]})
    return {
        "errors": errors[:5],
        "jobs": len(job_ids),
        "viewers": viewers,
        "sockets": len(sockets),
        "failed_sockets": results["failed"],
        "reconnects": results["reconnects"],
        "connect_s": results["connect_seconds"],
        "p50_ms": (results["p50"] or 0) * 1000,
        "p99_ms": (results["p99"] or 0) * 1000,
        "max_ms": (results["max"] or 0) * 1000,
        "lines_per_s": results["measured_lines"] / max(0.001, seconds - warmup),
        "expected_lines_per_s": len(job_ids) * viewers * RATE,
        "server_cpu_pct": 100 * cpu / wall,
        "server_sys_pct": 100 * (cpu_after.system - cpu_before.system) / wall,
        "load_cpu_pct": 100 * load_cpu / wall,
        "server_rss_mib": rss / 2**20,
        "lost": lost,
        "duplicated": sum(s["duplicates"] for s in sockets),
        "written_per_job": written,
    }


@pytest.fixture
def bench_server(request, transactional_db, tmp_path):
    """The Daphne of tests.servers.asgi_server; GPUGEEK_BENCH_PROFILE=<file> runs it under
    cProfile (stats written there when it stops) to see where server time goes."""
    profile = os.environ.get("GPUGEEK_BENCH_PROFILE")
    if not profile:
        yield request.getfixturevalue("asgi_server")
        return
    import signal

    from console.launcher import free_loopback_port
    from tests.servers import AsgiServer, _port_open, child_env, wait_until

    port = free_loopback_port()
    log_path = tmp_path / "daphne.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [*PROFILED_DAPHNE, profile, "-m", "daphne", *daphne_args(port)],
            cwd=ROOT,
            env=child_env(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    wait_until(lambda: _port_open(port), 30, what="daphne")
    try:
        yield AsgiServer(process, port, log_path)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def scenarios_for(config) -> tuple[list[tuple[int, int]], float]:
    """(jobs, viewers) per scenario and seconds of writing, for this session's size."""
    chosen = os.environ.get("GPUGEEK_BENCH_SCENARIOS")  # e.g. "10x100,100x10"
    full = full_size(config)
    scenarios = FULL if full else SMOKE
    if chosen:
        scenarios = [tuple(int(n) for n in item.split("x")) for item in chosen.split(",")]
    return scenarios, (20.0 if full else 4.0)


def pytest_generate_tests(metafunc):
    # One test (so one fresh server) per scenario: a scenario's 1,000 disconnecting
    # sockets don't weigh on the next one's figures.
    if "scenario" in metafunc.fixturenames:
        scenarios, _ = scenarios_for(metafunc.config)
        metafunc.parametrize("scenario", scenarios, ids=[f"{j}x{v}" for j, v in scenarios])


HEADER = (
    "jobs × viewers  sockets  p50 ms  p99 ms  max ms  lines/s (expected)  server CPU % "
    "(sys)  server RSS MiB  load-gen CPU %  lost  duplicated"
)


@pytest.mark.django_db(transaction=True)
def test_streaming_benchmark(bench_server, world, catalog, request, scenario):  # noqa: F811
    jobs, viewers = scenario
    _, seconds = scenarios_for(request.config)
    client = signed_in_client(world.member, world.tenant)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    load_before = os.getloadavg()  # other work on the machine skews every figure
    names = [f"bench {jobs}x{viewers} #{i}" for i in range(jobs)]
    job_ids = [make_job(world.tenant, name=name).pk for name in names]
    r = run_scenario(bench_server, cookie, job_ids, viewers, seconds)
    size = "full" if full_size(request.config) else "smoke"
    print(
        f"\nstreaming benchmark, {size} size: {os.cpu_count()} CPUs, {RATE} lines/s per job, "
        f"{seconds:.0f} s of writing, 1 Daphne process, load average before "
        f"{load_before[0]:.1f}\n{HEADER}"
    )
    print(
        f"{r['jobs']:>4} × {r['viewers']:<7} {r['sockets']:>7} {r['p50_ms']:>7.1f} "
        f"{r['p99_ms']:>7.1f} {r['max_ms']:>7.1f}  {r['lines_per_s']:>8.0f} "
        f"({r['expected_lines_per_s']:>6})  {r['server_cpu_pct']:>12.0f} "
        f"({r['server_sys_pct']:>3.0f})  "
        f"{r['server_rss_mib']:>14.0f}  {r['load_cpu_pct']:>14.0f}  "
        f"{r['lost']:>4}  {r['duplicated']:>10}"
    )
    if r["reconnects"]:
        print(f"{r['reconnects']} reconnects (resuming after their last line); {r['errors']}")
    assert r["failed_sockets"] == 0, r  # every socket got connected, if not at once
