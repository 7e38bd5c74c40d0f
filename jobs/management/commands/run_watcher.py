"""`manage.py run_watcher`: the long-running observer of compute backends.

It records its heartbeat every HEARTBEAT_INTERVAL so /healthz shows whether it is alive.
Backend observation (Kubernetes watches, local process reaping) is added by the jobs app
as it gains backends; until then this process has nothing else to observe.
"""

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from console.services import heartbeat_record


class Command(BaseCommand):
    help = "Watch compute backends and feed the job state machine."

    def handle(self, *args, **options):
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write("watcher started")
        while not stop.is_set():
            close_old_connections()
            try:
                heartbeat_record(component="watcher")
            except Exception as error:  # keep watching through a database blip
                self.stderr.write(f"watcher heartbeat failed: {error}")
            stop.wait(settings.HEARTBEAT_INTERVAL)
        self.stdout.write("watcher stopped")
