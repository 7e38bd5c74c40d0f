"""`manage.py run_watcher`: the long-running observer of compute backends.

Each pass applies what the backends report to the job state machine (through
jobs.services.jobs_observe), and records the watcher's heartbeat for /healthz. With the
Kubernetes backend, a watch on our Jobs and Pods (jobs.kube_watch) reports which jobs
changed, and those are observed at once; the full pass every WATCHER_INTERVAL remains the
safety net.
"""

import logging
import queue
import signal
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from console.services import heartbeat_record
from jobs.backends import BackendUnavailable, get_backend
from jobs.services import jobs_observe

log = logging.getLogger(__name__)
BURST_SECONDS = 0.2  # events arriving this close together make one pass


def start_kube_watch(stop: threading.Event, changed: queue.SimpleQueue) -> bool:
    """Follow the cluster's Jobs and Pods in a thread, putting changed job ids in `changed`."""
    if "kubernetes" not in settings.COMPUTE_BACKENDS:
        return False
    from jobs.kube_watch import watch_jobs

    try:
        api_client = get_backend("kubernetes").api_client
    except BackendUnavailable as error:
        log.warning("no Kubernetes watch (%s); polling only", error)
        return False
    threading.Thread(
        target=watch_jobs,
        kwargs={"api_client": api_client, "stop_event": stop, "on_change": changed.put},
        name="kube-watch",
        daemon=True,
    ).start()
    return True


def next_changes(changed: queue.SimpleQueue, timeout: float) -> set[int]:
    """Job ids reported within `timeout` seconds (returns early, after a short burst)."""
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
        changed: queue.SimpleQueue[int] = queue.SimpleQueue()

        def on_signal(*_) -> None:
            stop.set()
            changed.put(0)  # wake the wait below at once (no job has id 0)

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)
        self.stdout.write(f"watcher started (backends: {', '.join(settings.COMPUTE_BACKENDS)})")
        start_kube_watch(stop, changed)
        last_heartbeat = 0.0
        last_full_pass = float("-inf")
        changed_ids: set[int] = set()
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
                elif changed_ids:
                    try:
                        jobs_observe(backend_name="kubernetes", job_ids=changed_ids)
                    except BackendUnavailable as error:
                        log.warning("kubernetes backend unavailable: %s", error)
            except Exception:  # keep watching through a database blip
                log.exception("watcher pass failed")
            wait = max(0.0, settings.WATCHER_INTERVAL - (time.monotonic() - last_full_pass))
            changed_ids = next_changes(changed, wait)
        self.stdout.write("watcher stopped")
