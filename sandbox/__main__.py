"""`python -m sandbox --port P --nodes nodes.json --token-file token`: serve the sandbox
cluster until SIGTERM/SIGINT. Started by `manage.py runconsole` as one of its children."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from sandbox.cluster import SandboxCluster

log = logging.getLogger("gpugeek.sandbox")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--nodes", type=Path, required=True, help="JSON list of nodes")
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--tick", type=float, default=0.25, help="controller period (s)")
    parser.add_argument(
        "--volume-dir",
        type=Path,
        help="where volumes' data lives (default: volumes/ beside the token file)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sandbox: %(message)s")

    nodes = json.loads(args.nodes.read_text())
    token = args.token_file.read_text().strip()
    cluster = SandboxCluster(
        nodes,
        token=token,
        port=args.port,
        tick_seconds=args.tick,
        volume_root=args.volume_dir or args.token_file.parent / "volumes",
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    cluster.start()
    log.info("simulated cluster with %d nodes on 127.0.0.1:%d", len(nodes), args.port)
    stop.wait()
    cluster.stop()
    if cluster.server.errors:
        log.error("simulator errors:\n%s", "\n".join(cluster.server.errors[-5:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
