"""The HTTP layer: a threading HTTP/1.1 server whose handler hands each request to the
simulator's ``serve`` function and writes back a plain response or a chunked stream.

Connections are tracked so that ``close_connections`` can end open watch and log
streams when the simulator stops."""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sandbox.kubesim.errors import ApiError, status_body


def truthy(value: str | None) -> bool:
    """A boolean query parameter as the API reads it ("true" or "1")."""
    return (value or "").lower() in ("true", "1")


class ResetConnection(Exception):
    """Raised while serving a request: close its connection without any response."""


@dataclass
class Response:
    """A whole response; a dict or list body is sent as JSON, a str as text."""

    code: int
    body: Any
    content_type: str = "application/json"
    headers: dict = field(default_factory=dict)


@dataclass
class Stream:
    """A chunked response written as ``chunks`` yields (watch events, followed logs)."""

    content_type: str
    chunks: Iterator[bytes]
    headers: dict = field(default_factory=dict)


def _peer_closed(sock: socket.socket) -> bool:
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


#: ``serve(method, path, query, raw_body, headers, alive)``; ``alive()`` tells a stream
#: whether its client is still connected.
Serve = Callable[[str, str, dict[str, str], bytes, Any, Callable[[], bool]], "Response | Stream"]


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        addr: tuple[str, int],
        handler: type,
        *,
        serve: Serve,
        report_bug: Callable[[str], None],
        stopping: threading.Event,
    ) -> None:
        super().__init__(addr, handler)
        self.serve = serve
        self.report_bug = report_bug  # gets the traceback of a bug inside the simulator
        self.stopping = stopping
        self._conn_lock = threading.Lock()
        self.conns: set[socket.socket] = set()
        self.handler_threads: set[threading.Thread] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        t = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name="fake-kube-api-conn",
            daemon=True,
        )
        with self._conn_lock:
            self.conns.add(request)
            self.handler_threads.add(t)
        t.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conn_lock:
                self.conns.discard(request)
                self.handler_threads.discard(threading.current_thread())

    def close_connections(self) -> None:
        with self._conn_lock:
            conns = list(self.conns)
        for s in conns:
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError | OSError):
            return
        self.report_bug(traceback.format_exc())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver/1.0"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms stalls
    server: HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            resp = self.server.serve(
                method,
                split.path,
                query,
                raw,
                self.headers,
                lambda: not _peer_closed(self.connection),
            )
        except ResetConnection:
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        except ApiError as e:
            resp = Response(e.code, e.body(), headers=e.headers)
        except Exception as e:
            self.server.report_bug(traceback.format_exc())
            resp = Response(500, status_body(500, None, f"fake kube-apiserver bug: {e!r}"))
        try:
            if isinstance(resp, Stream):
                self._send_stream(resp)
            else:
                self._send(resp)
        except (ConnectionError, TimeoutError, OSError):
            self.close_connection = True

    def _send(self, resp: Response) -> None:
        body = resp.body
        if isinstance(body, dict | list):
            data = json.dumps(body).encode()
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = body or b""
        self.send_response(resp.code)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in resp.headers.items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, resp: Stream) -> None:
        self.send_response(200)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in resp.headers.items():
            self.send_header(k, str(v))
        self.end_headers()
        try:
            for chunk in resp.chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        finally:
            close = getattr(resp.chunks, "close", None)
            if close:
                close()
        if self.server.stopping.is_set():
            self.close_connection = True
