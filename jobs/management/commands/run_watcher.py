"""`manage.py run_watcher`: the long-running observer of compute backends.

Each pass applies what the backends report to the job state machine (through
jobs.services.jobs_observe), and records the watcher's heartbeat for /healthz. A backend
that can watch (`ComputeBackend.watch`, e.g. Kubernetes' watch on our Jobs and Pods)
reports which jobs changed, and those are observed at once; the full pass every
WATCHER_INTERVAL remains the safety net.
"""

import logging
import queue
import signal
import threading
import time
from collections import defaultdict

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from console.services import heartbeat_record
from jobs.backends import BackendUnavailable, configured_backends
from jobs.services import jobs_observe

log = logging.getLogger(__name__)
BURST_SECONDS = 0.2  # events arriving this close together make one pass


def start_watches(stop: threading.Event, changed: queue.SimpleQueue) -> list[str]:
    """Start every configured backend's watch, putting `(backend name, job id)` in
    `changed`; returns the names of the backends that watch (the others are polled)."""
    watching = []
    for backend in configured_backends():

        def on_change(job_id: int, name: str = backend.name) -> None:
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
                    for name in settings.COMPUTE_BACKENDS:
                        try:
                            jobs_observe(backend_name=name)
                        except BackendUnavailable as error:
                            log.warning("%s backend unavailable: %s", name, error)
                else:
                    by_backend: dict[str, set[int]] = defaultdict(set)
                    for name, job_id in changed_ids:
                        if name:
                            by_backend[name].add(job_id)
                    for name, job_ids in sorted(by_backend.items()):
                        try:
                            jobs_observe(backend_name=name, job_ids=job_ids)
                        except BackendUnavailable as error:
                            log.warning("%s backend unavailable: %s", name, error)
            except Exception:  # keep watching through a database blip
                log.exception("watcher pass failed")
            wait = max(0.0, settings.WATCHER_INTERVAL - (time.monotonic() - last_full_pass))
            changed_ids = next_changes(changed, wait)
        self.stdout.write("watcher stopped")
