"""What a replica pod (one a ReplicaSet owns: a long-running server, not a training run)
runs: a small real HTTP server on a loopback address of its own, so that a client
reaches the pod at ``podIP:port`` as it would in a cluster.

Every address of 127.0.0.0/8 reaches this host on Linux; each serving pod gets one of
127.0.<1-254>.<1-254> (127.0.0.x is left to everyone else) for as long as it lives.
The server answers a health path with 200 once ``SANDBOX_READY_AFTER_SECONDS`` have
passed (503 before), ``POST /generate`` with a few streamed lines, and anything else
with a JSON echo, after ``SANDBOX_LATENCY_MS``. It counts requests, from which the pod's
CPU use (``SANDBOX_CPU_MS_PER_REQUEST`` of CPU each) and, for a pod with GPUs, its GPU
utilisation (``SANDBOX_GPU_MS_PER_REQUEST`` of GPU time each) are derived.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_PORT = 8080
#: Paths that answer readiness (besides the pod's own readinessProbe path).
HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/livez", "/health", "/ready"})
GENERATE_CHUNKS = 5
#: How far back request times are kept (the longest metrics window that can be asked).
MAX_WINDOW_SECONDS = 120.0
BIND_ATTEMPTS = 32


def _env_float(env: dict[str, str], name: str, default: float) -> float:
    try:
        value = float(env.get(name, ""))
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


@dataclass(frozen=True)
class ServingKnobs:
    """How a serving pod behaves, from its first container's environment."""

    ready_after: float = 1.0
    latency: float = 0.005
    cpu_ms_per_request: float = 20.0
    gpu_ms_per_request: float = 50.0

    @classmethod
    def from_env(cls, env: dict[str, str]) -> ServingKnobs:
        return cls(
            ready_after=_env_float(env, "SANDBOX_READY_AFTER_SECONDS", cls.ready_after),
            latency=_env_float(env, "SANDBOX_LATENCY_MS", cls.latency * 1000) / 1000,
            cpu_ms_per_request=_env_float(
                env, "SANDBOX_CPU_MS_PER_REQUEST", cls.cpu_ms_per_request
            ),
            gpu_ms_per_request=_env_float(
                env, "SANDBOX_GPU_MS_PER_REQUEST", cls.gpu_ms_per_request
            ),
        )


class LoopbackPool:
    """The loopback addresses held by serving pods. One pool per process: several
    simulated clusters in one process (tests) never hand out the same address. Handed
    out round-robin, so a freed address is not reused soon."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._cursor = 0

    def take(self) -> Iterator[str]:
        """Free addresses, each held once yielded; give back the ones not kept."""
        for _ in range(254 * 254):
            with self._lock:
                n, self._cursor = self._cursor, (self._cursor + 1) % (254 * 254)
                address = f"127.0.{n // 254 + 1}.{n % 254 + 1}"
                if address in self._held:
                    continue
                self._held.add(address)
            yield address
        raise RuntimeError("every loopback address of the serving pods is held")

    def give_back(self, address: str) -> None:
        with self._lock:
            self._held.discard(address)

    def held(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._held)


LOOPBACK = LoopbackPool()


class _Server(ThreadingHTTPServer):
    """A threading HTTP server that can close its open keep-alive connections, so a
    deleted pod answers nothing more."""

    daemon_threads = True

    def __init__(self, addr: tuple[str, int], pod: ServingPod) -> None:
        super().__init__(addr, _Handler)
        self.pod = pod
        self._conn_lock = threading.Lock()
        self.conns: set[socket.socket] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            self.conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self.conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._conn_lock:
            conns = list(self.conns)
        for conn in conns:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is no bug worth a traceback on stderr."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a pod's access log is not the sandbox's output."""

    def do_GET(self) -> None:
        self._answer()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _answer(self) -> None:
        pod = self.server.pod
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        if self.command == "GET" and path in pod.health_paths:
            ready = pod.ready()
            self._send(200 if ready else 503, b"ok" if ready else b"starting", "text/plain")
            return
        pod.count_request()
        time.sleep(pod.knobs.latency)
        if self.command == "POST" and path == "/generate":
            self._generate()
            return
        echo = {
            "pod": pod.name,
            "path": self.path,
            "method": self.command,
            "body": body.decode("utf-8", "replace"),
        }
        self._send(200, json.dumps(echo).encode(), "application/json")

    def _send(self, code: int, content: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def _generate(self) -> None:
        pod = self.server.pod
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index in range(GENERATE_CHUNKS):
            line = json.dumps({"pod": pod.name, "index": index, "token": f"tok{index}"})
            data = (line + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            time.sleep(pod.knobs.latency)
        self.wfile.write(b"0\r\n\r\n")


class ServingPod:
    """One replica pod's HTTP server, on a loopback address held until ``stop()``."""

    def __init__(
        self,
        name: str,
        port: int,
        knobs: ServingKnobs,
        *,
        gpus: int = 0,
        probe_path: str | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.knobs = knobs
        self.gpus = gpus
        self.health_paths = HEALTH_PATHS | ({probe_path} if probe_path else set())
        self.requests_total = 0
        self._times: deque[float] = deque()
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._httpd, self.address = self._bind()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"serving-pod-{name}",
            daemon=True,
        )
        self._thread.start()

    def _bind(self) -> tuple[_Server, str]:
        """Bind the first free address on which ``port`` is free (another process may
        hold it there)."""
        addresses = LOOPBACK.take()
        for _ in range(BIND_ATTEMPTS):
            address = next(addresses)
            try:
                return _Server((address, self.port), self), address
            except OSError:
                LOOPBACK.give_back(address)
        raise OSError(f"no loopback address with port {self.port} free")

    def stop(self) -> None:
        """The container is killed: the server stops, its connections close and its
        address is free again."""
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        LOOPBACK.give_back(self.address)

    def ready(self) -> bool:
        return time.monotonic() >= self._started + self.knobs.ready_after

    def count_request(self) -> None:
        now = time.monotonic()
        with self._lock:
            self.requests_total += 1
            self._times.append(now)
            while self._times and self._times[0] < now - MAX_WINDOW_SECONDS:
                self._times.popleft()

    def _requests_within(self, window: float) -> int:
        since = time.monotonic() - window
        with self._lock:
            return sum(1 for t in self._times if t >= since)

    def cpu_millicores(self, window: float) -> float:
        """CPU use over the last ``window`` seconds, in millicores (as metrics-server
        reports it): requests per second × CPU milliseconds per request."""
        return self._requests_within(window) * self.knobs.cpu_ms_per_request / window

    def gpu_utilization(self, window: float) -> float:
        """Percent busy of each of its GPUs over the last ``window`` seconds (0 without
        GPUs): the GPU time its requests took over the time passed."""
        if not self.gpus:
            return 0.0
        busy = self._requests_within(window) * self.knobs.gpu_ms_per_request / 1000
        return min(100.0, 100 * busy / window)
