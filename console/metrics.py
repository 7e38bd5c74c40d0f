"""Prometheus metrics: the instruments every room may count with, the registry of
scrape-time collectors (values read from the database when Prometheus scrapes), and
`GET /metrics`.

Rooms above console register their collectors with `scrape_collector_register` from
their receivers' `connect()` (jobs: jobs by status, queue depth; billing: metering lag),
so console never imports them.

Several processes (web workers, Celery workers, the watcher) keep their counters apart;
with `PROMETHEUS_MULTIPROC_DIR` set in the environment of every process before it starts
(`manage.py runconsole` uses `$GPUGEEK_DATA_DIR/prometheus`, emptied at each start;
the image's entrypoint empties its own; an `emptyDir` per pod on Kubernetes),
prometheus-client writes them to files there and `/metrics` adds up all of them.
Without it, `/metrics` shows this process's counters.

`/metrics` answers only `Authorization: Bearer <METRICS_TOKEN>`; without the setting it
is a 404 (nothing is exposed by default), and it is never cached."""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import Metric

logger = logging.getLogger(__name__)

# --- instruments (counted where things happen) ---------------------------------------------
HTTP_REQUESTS = Counter(
    "gpugeek_http_requests",
    "HTTP requests answered, by view name, method and status code.",
    ["view", "method", "status"],
)
HTTP_LATENCY = Histogram(
    "gpugeek_http_request_duration_seconds",
    "Time to answer an HTTP request, by view name.",
    ["view"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
WEBSOCKET_CONNECTIONS = Gauge(
    "gpugeek_websocket_connections",
    "Open WebSocket connections, by path kind.",
    ["route"],
    multiprocess_mode="livesum",
)
CELERY_TASKS = Counter(
    "gpugeek_celery_tasks",
    "Celery task outcomes (success, failure, retry), by task name.",
    ["task", "outcome"],
)
CELERY_TASK_DURATION = Histogram(
    "gpugeek_celery_task_duration_seconds",
    "Run time of Celery tasks, by task name.",
    ["task"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
CELERY_TASK_LAST_DURATION = Gauge(
    "gpugeek_celery_task_last_duration_seconds",
    "Run time of the last run of each Celery task (the metering tick among them).",
    ["task"],
    multiprocess_mode="mostrecent",
)


# --- scrape-time collectors ---------------------------------------------------------------
class ScrapeCollector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


_scrape_collectors: dict[str, ScrapeCollector] = {}


def scrape_collector_register(name: str, collector: ScrapeCollector) -> None:
    """Add a collector whose `collect()` runs at each scrape (one query or two: it is
    called every scrape interval). Registering a name again replaces it."""
    _scrape_collectors[name] = collector


def _scraped() -> Iterator[Metric]:
    for name, collector in list(_scrape_collectors.items()):
        try:
            metrics = list(collector.collect())
        except Exception:  # one broken source must not hide the others
            logger.exception("metrics collector %s failed", name)
            continue
        yield from metrics


class _ScrapeTime:
    def collect(self) -> Iterator[Metric]:
        return _scraped()


def multiprocess_dir() -> str:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")


def multiprocess_dir_reset(directory: str | os.PathLike[str]) -> Path:
    """Create the multiprocess directory, or empty it of an earlier run's files (their
    counters would be added to this run's), before the processes that write it start."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
    return path


def exposition(*, database: bool = True) -> bytes:
    """The metrics text: what this process (or, in multiprocess mode, every process of
    the directory) counted, then, with `database`, the scrape-time collectors."""
    if multiprocess_dir():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        counted = generate_latest(registry)
    else:
        counted = generate_latest(REGISTRY)
    if not database:
        return counted
    scraped = CollectorRegistry()
    scraped.register(_ScrapeTime())
    return counted + generate_latest(scraped)


# --- the endpoint ---------------------------------------------------------------------------
def _bearer_ok(request: HttpRequest, token: str) -> bool:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode(), token.encode()
    )


@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if not token:
        return HttpResponse("Not found.", status=404, content_type="text/plain")
    if not _bearer_ok(request, token):
        response = HttpResponse("A valid bearer token is required.", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)


def counted_metrics_app(environ: dict, start_response: Any) -> list[bytes]:
    """WSGI app for processes that serve no HTTP of their own (a Celery worker pod):
    /metrics with the same token, without the database gauges (the web pods report
    those, once per scrape rather than once per pod)."""
    token = settings.METRICS_TOKEN
    scheme, _, presented = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    if environ.get("PATH_INFO") != "/metrics" or not token:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"Not found."]
    if not (
        scheme.lower() == "bearer"
        and hmac.compare_digest(presented.strip().encode(), token.encode())
    ):
        start_response("401 Unauthorized", [("WWW-Authenticate", 'Bearer realm="metrics"')])
        return [b"A valid bearer token is required."]
    start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Cache-Control", "no-store")])
    return [exposition(database=False)]


def counted_metrics_serve(port: int) -> Any:
    """Serve `counted_metrics_app` on `port` from a daemon thread; returns the server."""
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = make_server("", port, counted_metrics_app, WSGIServer, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def counted_metrics_serve_configured() -> Any | None:
    """In a process without HTTP of its own (a Celery worker, the watcher), serve its
    counters on METRICS_WORKER_PORT where that and METRICS_TOKEN are set. A port already
    taken is logged, not fatal: processes sharing one host (`runconsole`) also share the
    multiprocess directory, so whichever serves it shows them all."""
    if not (settings.METRICS_WORKER_PORT and settings.METRICS_TOKEN):
        return None
    try:
        return counted_metrics_serve(settings.METRICS_WORKER_PORT)
    except OSError as error:
        logger.warning("metrics not served on port %s: %s", settings.METRICS_WORKER_PORT, error)
        return None


def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    counted_metrics_serve_configured()


# --- HTTP middleware --------------------------------------------------------------------------
class HttpMetricsMiddleware:
    """Counts each request by its URL pattern's view name (never the raw path: that would
    be one series per job id) and status, and times it. First in MIDDLEWARE, so what the
    other middleware answers (a 413, a redirect to sign in) is counted too."""

    def __init__(self, get_response: Any):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        view = (match.view_name or "") if match is not None else ""
        view = view or ("static" if request.path.startswith(settings.STATIC_URL) else "unmatched")
        HTTP_REQUESTS.labels(view, request.method or "", str(response.status_code)).inc()
        HTTP_LATENCY.labels(view).observe(time.perf_counter() - started)
        return response


# --- WebSockets ---------------------------------------------------------------------------------
class WebsocketMetrics:
    """ASGI wrapper that counts open WebSocket connections (accepted ones, until closed)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "websocket":
            await self.app(scope, receive, send)
            return
        parts = [part for part in scope.get("path", "").split("/") if part]
        route = parts[1] if len(parts) > 1 else (parts[0] if parts else "")
        gauge = WEBSOCKET_CONNECTIONS.labels(route if route.isidentifier() else "other")
        opened = False

        async def counting_send(message: dict) -> None:
            nonlocal opened
            if message.get("type") == "websocket.accept" and not opened:
                opened = True
                gauge.inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if opened:
                gauge.dec()


# --- Celery ---------------------------------------------------------------------------------------
_task_started: dict[str, float] = {}


def _task_name(sender: Any) -> str:
    return str(getattr(sender, "name", None) or sender or "unknown")


def _on_prerun(sender: Any = None, task_id: str = "", **kwargs: Any) -> None:
    _task_started[task_id] = time.perf_counter()


def _on_postrun(sender: Any = None, task_id: str = "", **kwargs: Any) -> None:
    started = _task_started.pop(task_id, None)
    if started is not None:
        elapsed = time.perf_counter() - started
        name = _task_name(sender)
        CELERY_TASK_DURATION.labels(name).observe(elapsed)
        CELERY_TASK_LAST_DURATION.labels(name).set(elapsed)


def _on_success(sender: Any = None, **kwargs: Any) -> None:
    CELERY_TASKS.labels(_task_name(sender), "success").inc()


def _on_failure(sender: Any = None, **kwargs: Any) -> None:
    CELERY_TASKS.labels(_task_name(sender), "failure").inc()


def _on_retry(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    # task_retry's sender is the task object.
    CELERY_TASKS.labels(_task_name(sender), "retry").inc()


def celery_signals_connect() -> None:
    from celery import signals

    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="gg-metrics-prerun")
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="gg-metrics-postrun")
    signals.task_success.connect(_on_success, weak=False, dispatch_uid="gg-metrics-success")
    signals.task_failure.connect(_on_failure, weak=False, dispatch_uid="gg-metrics-failure")
    signals.task_retry.connect(_on_retry, weak=False, dispatch_uid="gg-metrics-retry")
    signals.worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="gg-metrics-serve")
