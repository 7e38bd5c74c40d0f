"""`manage.py run_watcher`: the long-running observer of compute backends.

Each pass applies what the backends report to the job state machine (through
jobs.services.jobs_observe), and records the watcher's heartbeat for /healthz.
"""

import logging
import signal
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from console.services import heartbeat_record
from jobs.backends import BackendUnavailable
from jobs.services import jobs_observe

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Watch compute backends and feed the job state machine."

    def handle(self, *args, **options):
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write(f"watcher started (backends: {', '.join(settings.COMPUTE_BACKENDS)})")
        last_heartbeat = 0.0
        while not stop.is_set():
            close_old_connections()
            try:
                if time.monotonic() - last_heartbeat >= settings.HEARTBEAT_INTERVAL:
                    heartbeat_record(component="watcher")
                    last_heartbeat = time.monotonic()
                for name in settings.COMPUTE_BACKENDS:
                    try:
                        jobs_observe(backend_name=name)
                    except BackendUnavailable as error:
                        log.warning("%s backend unavailable: %s", name, error)
            except Exception:  # keep watching through a database blip
                log.exception("watcher pass failed")
            stop.wait(settings.WATCHER_INTERVAL)
        self.stdout.write("watcher stopped")
