"""Streaming benchmark: job log lines from the file a job writes to the browsers' sockets,
through the real stack (uvicorn, the Redis channel layer, one log follower per job).

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
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from console.launcher import asgi_server_argv, free_loopback_port
from tests.bench.results import record
from tests.conftest import signed_in_client
from tests.jobs.test_consumers import make_job
from tests.servers import ROOT, AsgiServer, _port_open, child_env, wait_until

RATE = 50  # lines per second per job
# Seconds between two sockets' connects: pages arriving, not a storm. Each handshake costs
# the server a session and a user query on Channels' one database thread (AuthMiddleware).
RAMP = 0.04
PROFILED = [sys.executable, "-m", "tests.bench.streaming.profiled"]


FULL = [(10, 100), (100, 10)]
SMOKE = [(2, 5)]


def full_size(config) -> bool:
    """Full when asked (GPUGEEK_BENCH=full, or tests/bench named on the command line)."""
    chosen = os.environ.get("GPUGEEK_BENCH") or os.environ.get("GPUGEEK_BENCH_SIZE")
    if chosen in ("full", "smoke"):
        return chosen == "full"
    return any(str(arg).rstrip("/").startswith("tests/bench") for arg in config.args)


def server_profiled(server) -> bool:
    return server.process.args[:3] == PROFILED


def server_cpu(processes) -> tuple[float, float]:
    """User and system CPU seconds of the server processes together."""
    times = [process.cpu_times() for process in processes]
    return sum(t.user for t in times), sum(t.system for t in times)


def run_scenario(servers, cookie: str, job_ids: list[int], viewers: int, seconds: float) -> dict:
    files = [Path(settings.DATA_DIR) / "jobs" / str(job) / "output.log" for job in job_ids]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    # Sockets are spread over the server processes in turn, as a balancer would.
    config = {"ws_urls": [server.ws_url for server in servers], "cookie": cookie}
    config["origin"] = servers[0].url
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
        processes = [psutil.Process(server.process.pid) for server in servers]
        load_process = psutil.Process(load.pid)
        cpu_before, load_before = server_cpu(processes), load_process.cpu_times()
        started = time.time()
        warmup = min(2.0, seconds / 4)
        for server in servers:
            if server_profiled(server):
                server.process.send_signal(signal.SIGUSR2)  # profile the writing phase only
        writer = subprocess.run(
            [sys.executable, "-m", "tests.bench.streaming.writer", str(seconds), str(RATE)]
            + [str(f) for f in files],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        time.sleep(1.5)  # let the last batches arrive
        for server in servers:
            if server_profiled(server):
                server.process.send_signal(signal.SIGUSR2)
        wall = time.time() - started
        cpu_after, load_after = server_cpu(processes), load_process.cpu_times()
        rss = sum(process.memory_info().rss for process in processes)
        report = json.loads(writer.stdout)
        command = {"measure_from": started + warmup, "written_at": report["written_at"]}
        out, _ = load.communicate(json.dumps(command), timeout=120)
    finally:
        if load.poll() is None:
            load.kill()
    results = json.loads(out)
    written = report["lines_per_file"]
    sockets = results["sockets"]
    lost = sum(s["gaps"] for s in sockets) + sum(
        written - (s["last"] or 0) for s in sockets if (s["last"] or 0) < written
    )
    cpu = sum(cpu_after) - sum(cpu_before)
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
        "breakdown": {
            key: round((results[key] or 0) * 1000, 1)
            for key in ("read_p50", "read_p99", "send_p50", "send_p99")
        },
        "lines_per_s": results["measured_lines"] / max(0.001, seconds - warmup),
        "expected_lines_per_s": len(job_ids) * viewers * RATE,
        "server_cpu_pct": 100 * cpu / wall,
        "server_sys_pct": 100 * (cpu_after[1] - cpu_before[1]) / wall,
        "load_cpu_pct": 100 * load_cpu / wall,
        "server_rss_mib": rss / 2**20,
        "lost": lost,
        "duplicated": sum(s["duplicates"] for s in sockets),
        "written_per_job": written,
    }


def server_command(port: int) -> tuple[str, list[str]]:
    """The ASGI server to measure, as `runconsole` runs it: (module, its arguments)."""
    _, flag, module, *arguments = asgi_server_argv("127.0.0.1", port)
    assert flag == "-m"
    return module, arguments


def server_count() -> int:
    """How many server processes (GPUGEEK_BENCH_SERVERS, default 1): each serves its own
    sockets, and a job's batches reach the other processes through the Redis channel
    layer. On this 2-core machine, with the load generator on it too, two processes
    measured worse than one (each batch crosses Redis, and the hubs fell behind)."""
    return int(os.environ.get("GPUGEEK_BENCH_SERVERS") or 1)


@pytest.fixture
def bench_servers(request, transactional_db, tmp_path):
    """The ASGI server processes under test, against the test database.
    GPUGEEK_BENCH_PROFILE=<file> runs them under cProfile (stats of the writing phase
    written to <file>.<n> when they stop)."""
    profile = os.environ.get("GPUGEEK_BENCH_PROFILE")
    servers = []
    try:
        for number in range(server_count()):
            port = free_loopback_port()
            module, arguments = server_command(port)
            command = [sys.executable, "-m", module, *arguments]
            if profile:
                command = [*PROFILED, f"{profile}.{number}", "-m", module, *arguments]
            log_path = tmp_path / f"server-{number}.log"
            with log_path.open("wb") as log_file:
                process = subprocess.Popen(
                    command, cwd=ROOT, env=child_env(), stdout=log_file, stderr=subprocess.STDOUT
                )
            servers.append(AsgiServer(process, port, log_path))
            wait_until(lambda: process.poll() is not None or _port_open(port), 30, what=module)
            assert process.poll() is None, log_path.read_text()
        yield servers
    finally:
        for server in servers:
            server.process.send_signal(signal.SIGINT)
        for server in servers:
            try:
                server.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()


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
def test_streaming_benchmark(bench_servers, world, catalog, request, scenario):
    jobs, viewers = scenario
    _, seconds = scenarios_for(request.config)
    client = signed_in_client(world.member, world.tenant)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    load_before = os.getloadavg()  # other work on the machine skews every figure
    names = [f"bench {jobs}x{viewers} #{i}" for i in range(jobs)]
    job_ids = [make_job(world.tenant, name=name).pk for name in names]
    r = run_scenario(bench_servers, cookie, job_ids, viewers, seconds)
    size = "full" if full_size(request.config) else "smoke"
    print(
        f"\nstreaming benchmark, {size} size: {os.cpu_count()} CPUs, {RATE} lines/s per job, "
        f"{seconds:.0f} s of writing, {len(bench_servers)} {server_command(0)[0]} "
        f"process(es), load average before "
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
    print(f"batch first lines, ms: written → read by the server, read → received: {r['breakdown']}")
    if r["reconnects"]:
        print(f"{r['reconnects']} reconnects (resuming after their last line); {r['errors']}")
    record(
        "streaming",
        f"log line written → received p99, {jobs} jobs × {viewers} viewers "
        f"({r['lines_per_s']:.0f} lines/s delivered, lost {r['lost']})",
        r["p99_ms"],
        "ms",
    )
    assert r["failed_sockets"] == 0, r  # every socket got connected, if not at once
