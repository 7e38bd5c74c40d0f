"""`manage.py run_watcher`: the long-running observer of compute backends.

Each pass applies what the backends report to the job state machine (through
jobs.services.jobs_observe), and records the watcher's heartbeat for /healthz. A backend
that can watch (`ComputeBackend.watch`, e.g. Kubernetes' watch on our Jobs and Pods)
reports which jobs changed, and those are observed at once; the full pass every
WATCHER_INTERVAL remains the safety net. Its events and passes are counted for /metrics
(jobs/prometheus.py), served on METRICS_WORKER_PORT where that is set.
"""

import logging
import queue
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Mapping

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from console.heartbeats import heartbeat_record
from console.metrics import counted_metrics_serve_configured
from jobs.backends import BackendUnavailable, configured_backends
from jobs.prometheus import (
    WATCHER_BACKEND_UNAVAILABLE,
    WATCHER_EVENTS,
    WATCHER_LAST_EVENT,
    WATCHER_LAST_PASS,
    WATCHER_PASS_DURATION,
)
from jobs.services import jobs_observe

log = logging.getLogger(__name__)
BURST_SECONDS = 0.2  # events arriving this close together make one pass


def start_watches(stop: threading.Event, changed: queue.SimpleQueue) -> list[str]:
    """Start every configured backend's watch, putting `(backend name, job id)` in
    `changed`; returns the names of the backends that watch (the others are polled)."""
    watching = []
    for backend in configured_backends():

        def on_change(job_id: int, name: str = backend.name) -> None:
            WATCHER_EVENTS.labels(name).inc()
            WATCHER_LAST_EVENT.labels(name).set(time.time())
            changed.put((name, job_id))

        try:
            if backend.watch(stop, on_change):
                watching.append(backend.name)
        except BackendUnavailable as error:
            log.warning("no %s watch (%s); polling only", backend.name, error)
    return watching


def next_changes(changed: queue.SimpleQueue, timeout: float) -> set[tuple[str, int]]:
    """`(backend name, job id)` reported within `timeout` seconds (returns early, after a
    short burst)."""
    try:
        ids = {changed.get(timeout=timeout)}
    except queue.Empty:
        return set()
    deadline = time.monotonic() + BURST_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        try:
            ids.add(changed.get(timeout=left))
        except queue.Empty:
            break
    return ids


def observe_pass(kind: str, targets: Mapping[str, set[int] | None]) -> None:
    """Observe each backend named in `targets` (all its live jobs where the ids are None),
    and count the pass under `kind` (`full` or `changed`) once every backend is done."""
    started = time.perf_counter()
    for name, job_ids in targets.items():
        try:
            jobs_observe(backend_name=name, job_ids=job_ids)
        except BackendUnavailable as error:
            WATCHER_BACKEND_UNAVAILABLE.labels(name).inc()
            log.warning("%s backend unavailable: %s", name, error)
    WATCHER_PASS_DURATION.labels(kind).observe(time.perf_counter() - started)
    WATCHER_LAST_PASS.labels(kind).set(time.time())


class Command(BaseCommand):
    help = "Watch compute backends and feed the job state machine."

    def handle(self, *args, **options):
        stop = threading.Event()
        changed: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()

        def on_signal(*_) -> None:
            stop.set()
            changed.put(("", 0))  # wake the wait below at once (no job has id 0)

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)
        counted_metrics_serve_configured()
        self.stdout.write(f"watcher started (backends: {', '.join(settings.COMPUTE_BACKENDS)})")
        start_watches(stop, changed)
        last_heartbeat = 0.0
        last_full_pass = float("-inf")
        changed_ids: set[tuple[str, int]] = set()
        while not stop.is_set():
            close_old_connections()
            try:
                if time.monotonic() - last_heartbeat >= settings.HEARTBEAT_INTERVAL:
                    heartbeat_record(component="watcher")
                    last_heartbeat = time.monotonic()
                if time.monotonic() - last_full_pass >= settings.WATCHER_INTERVAL:
                    last_full_pass = time.monotonic()
                    observe_pass("full", dict.fromkeys(settings.COMPUTE_BACKENDS))
                else:
                    by_backend: dict[str, set[int]] = defaultdict(set)
                    for name, job_id in changed_ids:
                        if name:
                            by_backend[name].add(job_id)
                    if by_backend:
                        observe_pass("changed", dict(sorted(by_backend.items())))
            except Exception:  # keep watching through a database blip
                log.exception("watcher pass failed")
            wait = max(0.0, settings.WATCHER_INTERVAL - (time.monotonic() - last_full_pass))
            changed_ids = next_changes(changed, wait)
        self.stdout.write("watcher stopped")
