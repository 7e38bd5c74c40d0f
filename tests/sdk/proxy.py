"""A lossy HTTP proxy in front of the real server, for the SDK's retry and resume tests."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx

HOP_HEADERS = ("host", "content-length", "connection")


class LossyProxy:
    """Answers 503 (without forwarding) to the first `fail_first` requests, and for each
    POST to /jobs forwards it, then answers 503 the first time anyway: the job is created
    but the client never hears of it, as when a load balancer drops the response.

    `flaky_logs`: every 3rd log read a 503, every 5th a dropped link (no response).
    `cut_streams`: the first so many log streams break: every 3rd is a 503, the others
    are forwarded as they come and cut in the middle of a line after a few lines, by
    turns with a body that ends at the close (the client sees a clean end) and a chunked
    one left incomplete (the client sees a protocol error)."""

    def __init__(
        self, upstream: str, fail_first: int = 1, flaky_logs: bool = False, cut_streams: int = 0
    ):
        self.upstream = upstream
        self.fail_first = fail_first
        self.flaky_logs = flaky_logs
        self.cut_streams = cut_streams
        self.log_reads = 0
        self.stream_since: list[int] = []  # since_line of each log stream asked for
        self.streams_cut = 0
        self.seen: list[tuple[str, str, str | None]] = []
        self.posts_swallowed = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                key = self.headers.get("Idempotency-Key")
                proxy.seen.append((self.command, self.path, key))
                if len(proxy.seen) <= proxy.fail_first:
                    return self._reply(503, b'{"detail": "unavailable"}')
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                if urlsplit(self.path).path.rstrip("/").endswith("/logs/stream"):
                    return self._stream(headers)
                if proxy.flaky_logs and "/logs" in self.path:
                    proxy.log_reads += 1
                    if proxy.log_reads % 5 == 0:
                        self.close_connection = True
                        return None  # no response at all: the client sees the link drop
                    if proxy.log_reads % 3 == 0:
                        return self._reply(503, b'{"detail": "unavailable"}')
                upstream = httpx.request(self.command, proxy.upstream + self.path,
                                         headers=headers, content=body)  # fmt: skip
                creates = self.command == "POST" and self.path.rstrip("/").endswith("/jobs")
                if creates and proxy.posts_swallowed == 0:
                    proxy.posts_swallowed += 1
                    return self._reply(503, b'{"detail": "gateway lost it"}')
                self._reply(upstream.status_code, upstream.content)

            def _stream(self, headers):
                query = parse_qs(urlsplit(self.path).query)
                proxy.stream_since.append(int(query.get("since_line", ["0"])[0]))
                number = len(proxy.stream_since)
                breaking = number <= proxy.cut_streams
                if breaking and number % 3 == 0:
                    return self._reply(503, b'{"detail": "unavailable"}')
                chunked = number % 2 == 0
                self.close_connection = True
                url = proxy.upstream + self.path
                with httpx.stream("GET", url, headers=headers, timeout=None) as upstream:
                    if chunked:
                        self.protocol_version = "HTTP/1.1"
                    self.send_response(upstream.status_code)
                    self.send_header("Content-Type", upstream.headers.get("content-type", ""))
                    if chunked:
                        self.send_header("Transfer-Encoding", "chunked")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    forwarded = 0
                    for data in upstream.iter_bytes():
                        if breaking and forwarded >= 2 and len(data) > 2:
                            cut = len(data) // 2
                            if data[cut - 1 : cut] == b"\n":
                                cut -= 1  # mid-line, never just after one
                            self._write(data[:cut], chunked, incomplete=True)
                            proxy.streams_cut += 1
                            return None
                        self._write(data, chunked)
                        forwarded += data.count(b"\n")
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                return None

            def _write(self, data, chunked, incomplete=False):
                if chunked:  # an incomplete chunk announces more than it carries
                    size = len(data) + (10 if incomplete else 0)
                    data = f"{size:x}\r\n".encode() + data + (b"" if incomplete else b"\r\n")
                self.wfile.write(data)
                self.wfile.flush()

            def _reply(self, status, content):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
