"""Load generator: opens VIEWERS sockets per job to /ws/jobs/<id>/ and records, per
socket, every log line number received and each line's latency (time received minus the
time the writer wrote it, which the benchmark passes in at the end; both clocks are this
host's).

Run as `python -m tests.bench.streaming.load CONFIG_JSON`. It prints "connected" on
stderr once every socket is open, then reads `{"measure_from": <unix time>}` from stdin;
then `{"measure_from": <unix time>, "written_at": [<unix time of line n>, …]}` when the
writing is over; it stops and prints its results (JSON) on stdout.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import sys
import time
from datetime import datetime

import aiohttp


class Viewer:
    """What one socket received: per log message the line numbers (a range when they
    follow each other, as they nearly always do), the server's read time of its first
    line, and when it arrived. Lines are matched to their write times afterwards, so
    the receiving loop does little per message (it shares the CPUs with the server)."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.messages: list[tuple[int, int, object, str, float]] = []
        self.last = 0  # the highest line number received
        self.error = ""
        self.reconnects = 0

    def numbers(self) -> list[int]:
        found: list[int] = []
        for first, last, explicit, _ts, _at in self.messages:
            found.extend(explicit if explicit is not None else range(first, last + 1))
        return found


async def watch(session, config, viewer: Viewer, progress: dict, ws_url: str) -> None:
    """Like the job page: (re)connect with backoff, resuming after the last line held."""
    headers = {"Origin": config["origin"], "Cookie": config["cookie"]}
    opened = False
    delay = 0.5
    messages = viewer.messages
    while True:
        resume = f"?since_line={viewer.last}" if viewer.last else ""
        url = f"{ws_url}/ws/jobs/{viewer.job_id}/{resume}"
        try:
            async with session.ws_connect(url, headers=headers, max_msg_size=0) as ws:
                if not opened:
                    opened = True
                    progress["open"] += 1
                    if progress["open"] == progress["total"]:
                        progress["event"].set()
                delay = 0.5
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.TEXT:
                        break
                    now = time.time()
                    data = json.loads(message.data)
                    lines = data.get("lines")
                    if data.get("type") != "log" or not lines:
                        continue
                    first, last = lines[0]["line_no"], lines[-1]["line_no"]
                    explicit = None
                    if last - first + 1 != len(lines):
                        explicit = [line["line_no"] for line in lines]
                    messages.append((first, last, explicit, lines[0]["ts"], now))
                    viewer.last = max(viewer.last, last, *(explicit or ()))
        except (aiohttp.ClientError, OSError) as error:
            viewer.error = repr(error)
        viewer.reconnects += 1
        await asyncio.sleep(delay * random.uniform(0.5, 1.5))  # jitter: no reconnect storm
        delay = min(10.0, delay * 2)


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(fraction * len(values)))]


async def main() -> None:
    config = json.loads(sys.argv[1])
    viewers = [Viewer(job) for job in config["jobs"] for _ in range(config["viewers"])]
    progress = {"open": 0, "total": len(viewers), "event": asyncio.Event()}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.time()
        tasks = []
        urls = config["ws_urls"]
        for number, viewer in enumerate(viewers):
            url = urls[number % len(urls)]  # round robin, like a balancer
            tasks.append(asyncio.ensure_future(watch(session, config, viewer, progress, url)))
            await asyncio.sleep(config.get("ramp", 0.01))  # pages arrive, not a storm
        await asyncio.wait_for(progress["event"].wait(), 180)
        connect_seconds = time.time() - started
        # The measuring client must not add pauses of its own to the figures: no cyclic
        # garbage collection while it measures (a full one takes ~0.2 s with 1,000 sockets).
        gc.collect()
        gc.freeze()
        gc.disable()
        sys.stderr.write("connected\n")
        sys.stderr.flush()
        loop = asyncio.get_running_loop()
        command = json.loads(await loop.run_in_executor(None, sys.stdin.read) or "{}")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    measure_from = command.get("measure_from", 0)
    written_at = command.get("written_at", [])  # written_at[n - 1]: when line n was written
    latencies, sockets, read_delays, send_delays = [], [], [], []
    for viewer in viewers:
        for first, last, explicit, ts, received in viewer.messages:
            numbers = explicit if explicit is not None else range(first, last + 1)
            latencies.extend(
                received - written_at[n - 1]
                for n in numbers
                if n <= len(written_at) and written_at[n - 1] >= measure_from
            )
            if first <= len(written_at) and written_at[first - 1] >= measure_from:
                read_at = datetime.fromisoformat(ts).timestamp()
                read_delays.append(read_at - written_at[first - 1])
                send_delays.append(received - read_at)
        numbers = viewer.numbers()
        unique = set(numbers)
        sockets.append(
            {
                "job": viewer.job_id,
                "first": min(unique) if unique else None,
                "last": max(unique) if unique else None,
                "received": len(numbers),
                "duplicates": len(numbers) - len(unique),
                "gaps": (max(unique) - min(unique) + 1 - len(unique)) if unique else 0,
                "error": viewer.error,
            }
        )
    print(
        json.dumps(
            {
                "connect_seconds": connect_seconds,
                "failed": progress["total"] - progress["open"],
                "reconnects": sum(v.reconnects for v in viewers),
                "measured_lines": len(latencies),
                "p50": percentile(latencies, 0.50),
                "p99": percentile(latencies, 0.99),
                "max": max(latencies) if latencies else None,
                # A batch's first line: written → read by the server → received.
                "read_p50": percentile(read_delays, 0.50),
                "read_p99": percentile(read_delays, 0.99),
                "send_p50": percentile(send_delays, 0.50),
                "send_p99": percentile(send_delays, 0.99),
                "sockets": sockets,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
