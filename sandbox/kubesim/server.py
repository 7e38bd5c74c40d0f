"""``KubeAPIServer``: the simulated cluster put together from its parts, with its
lifecycle (an HTTP server and a controller thread on ``127.0.0.1:<free port>``) and the
client configuration that points the official ``kubernetes`` client at it."""

from __future__ import annotations

import threading
import time
import traceback
from contextlib import suppress
from pathlib import Path

import yaml
from kubernetes import client as k8s_client

from sandbox.kubesim.api import Api
from sandbox.kubesim.cluster import ClusterHelpers
from sandbox.kubesim.http import Handler, HTTPServer
from sandbox.kubesim.kinds import KindHooks
from sandbox.kubesim.resources import BUILTIN_TYPES


class KubeAPIServer(Api, ClusterHelpers, KindHooks):
    """An in-process fake kube-apiserver with a fake Job controller, scheduler and kubelet.

    Thread-safe: every store access holds one re-entrant lock; streaming responses wait
    on a condition of that lock and end when the server stops.
    """

    def __init__(
        self,
        *,
        auto_tick: float | None = 0.05,
        watch_history: int = 1000,
        token: str | None = None,
        namespaces: tuple[str, ...] = ("default", "kube-system", "kube-public"),
        port: int = 0,
    ) -> None:
        """``port`` 0 takes a free port; ``token`` None accepts any bearer token."""
        super().__init__(watch_history=watch_history)
        self._listen_port = port
        self._clients: list[k8s_client.ApiClient] = []
        self._httpd: HTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self.auto_tick = auto_tick
        self.token = token
        self.port: int | None = None
        for rt in BUILTIN_TYPES:
            self.register_resource(rt)
        for ns in namespaces:
            self.create("namespaces", {"metadata": {"name": ns}})

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> KubeAPIServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = HTTPServer(
            ("127.0.0.1", self._listen_port),
            Handler,
            serve=self._serve,
            report_bug=self._report_bug,
            stopping=self._stopping,
        )
        self._httpd = httpd
        self.port = httpd.server_address[1]
        serve = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-kube-api",
            daemon=True,
        )
        serve.start()
        self._threads = [serve]
        if self.auto_tick:
            ctl = threading.Thread(target=self._controller_loop, name="fake-kube-ctl", daemon=True)
            ctl.start()
            self._threads.append(ctl)
        return self

    def stop(self) -> None:
        httpd = self._httpd
        if httpd is None:
            return
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        httpd.shutdown()
        for c in self._clients:
            with suppress(Exception):
                c.close()
        self._clients.clear()
        httpd.close_connections()
        httpd.server_close()
        self._stop_serving()
        deadline = time.monotonic() + 3
        for t in [*self._threads, *list(httpd.handler_threads)]:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._httpd = None

    def __enter__(self) -> KubeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _controller_loop(self) -> None:
        while not self._stopping.wait(self.auto_tick or 0.05):
            if self._paused:
                continue
            try:
                self.tick()
            except Exception:
                self.errors.append(traceback.format_exc())

    def configuration(self) -> k8s_client.Configuration:
        cfg = k8s_client.Configuration(host=self.url)
        cfg.api_key = {"BearerToken": self.token or "fake-token"}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cfg

    def api_client(self) -> k8s_client.ApiClient:
        """A fresh ``kubernetes.client.ApiClient`` for this server (closed on stop())."""
        c = k8s_client.ApiClient(self.configuration())
        self._clients.append(c)
        return c

    def kubeconfig_dict(self, namespace: str = "default") -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token or "fake-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }

    def kubeconfig_path(self, directory: str | Path, namespace: str = "default") -> Path:
        """Write a kubeconfig for ``kubernetes.config.load_kube_config`` and return its path."""
        path = Path(directory) / "kubeconfig"
        path.write_text(yaml.safe_dump(self.kubeconfig_dict(namespace)))
        return path

    def advance_clock(self, seconds: float) -> None:
        """Move the fake's clock (activeDeadlineSeconds, TTLs, PodRun durations) forward."""
        with self._lock:
            self._clock_offset += seconds
        self._react()
