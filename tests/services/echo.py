"""A tiny HTTP server for service tests, run as a replica's command (`python3 -c`): the
sandbox shows a replica no file of ours, so its source travels in argv.

GET /healthz answers "ok" (after READY_DELAY seconds from its start); GET /whoami
answers the replica's REPLICA_NAME env and the headers it got; GET /set-cookie?v=X sets
the cookie `session=X`; GET /sleep?s=N answers
after N seconds; GET /events sends four server-sent events half a second apart (as a
model streams tokens); POST /echo streams the
body back as it reads it (chunked), so the gateway's streaming is what is tested."""

from __future__ import annotations

SOURCE = r"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTED = time.monotonic()
INSTANCE = os.urandom(6).hex()  # pids repeat: each sandbox has its own PID namespace
DELAY = float(os.environ.get("READY_DELAY", "0"))

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, status, body, kind="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/healthz":
            ready = time.monotonic() - STARTED >= DELAY
            self._send(200 if ready else 503, b"ok" if ready else b"wait")
        elif self.path.startswith("/whoami"):
            body = json.dumps({
                "replica": os.environ.get("REPLICA_NAME", ""),
                "instance": INSTANCE,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }).encode()
            self._send(200, body, "application/json")
        elif self.path.startswith("/set-cookie"):
            self.send_response(200)
            self.send_header("Set-Cookie", "session=" + self.path.rsplit("=", 1)[-1] + "; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.startswith("/sleep"):
            time.sleep(float(self.path.rsplit("=", 1)[-1]))
            self._send(200, b"slept")
        elif self.path == "/events":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for number in range(4):
                event = b"id: %d\ndata: token %d\n\n" % (number, number)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(0.5)
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._send(404, b"no such path")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        left = length
        while left:
            chunk = self.rfile.read(min(65536, left))
            if not chunk:
                break
            left -= len(chunk)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("0.0.0.0", int(os.environ["PORT"])), Handler).serve_forever()
"""

COMMAND = ["python3", "-c", SOURCE]
