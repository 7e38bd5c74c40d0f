"""Load generator: opens VIEWERS sockets per job to /ws/jobs/<id>/ and records, per
socket, every log line number received and each line's latency (time received minus the
time the writer wrote it; both clocks are this host's).

Run as `python -m tests.bench.streaming.load CONFIG_JSON`. It prints "connected" on
stderr once every socket is open, then reads `{"measure_from": <unix time>}` from stdin;
when stdin closes it stops and prints its results (JSON) on stdout.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import aiohttp


class Viewer:
    def __init__(self, job_id: int):
        self.job_id = job_id
        self.numbers: list[int] = []
        self.received: list[tuple[float, float]] = []  # (written, received)
        self.error = ""
        self.reconnects = 0


async def watch(session, config, viewer: Viewer, progress: dict) -> None:
    """Like the job page: (re)connect with backoff, resuming after the last line held."""
    headers = {"Origin": config["origin"], "Cookie": config["cookie"]}
    opened = False
    delay = 0.5
    while True:
        resume = f"?since_line={max(viewer.numbers)}" if viewer.numbers else ""
        url = f"{config['ws_url']}/ws/jobs/{viewer.job_id}/{resume}"
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
                    if data.get("type") != "log":
                        continue
                    for line in data["lines"]:
                        viewer.numbers.append(line["line_no"])
                        viewer.received.append((float(line["text"].split(" ", 1)[1]), now))
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
        for viewer in viewers:
            tasks.append(asyncio.ensure_future(watch(session, config, viewer, progress)))
            await asyncio.sleep(config.get("ramp", 0.01))  # pages arrive, not a storm
        await asyncio.wait_for(progress["event"].wait(), 180)
        connect_seconds = time.time() - started
        sys.stderr.write("connected\n")
        sys.stderr.flush()
        loop = asyncio.get_running_loop()
        command = json.loads(await loop.run_in_executor(None, sys.stdin.read) or "{}")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    measure_from = command.get("measure_from", 0)
    latencies, sockets = [], []
    for viewer in viewers:
        latencies.extend(r - w for w, r in viewer.received if w >= measure_from)
        unique = set(viewer.numbers)
        sockets.append(
            {
                "job": viewer.job_id,
                "first": min(unique) if unique else None,
                "last": max(unique) if unique else None,
                "received": len(viewer.numbers),
                "duplicates": len(viewer.numbers) - len(unique),
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
                "sockets": sockets,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
