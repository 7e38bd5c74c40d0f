"""The Celery app, plus the worker heartbeat that lets /healthz see a dead worker."""

from __future__ import annotations

import os

from celery import Celery, bootsteps, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("gpugeek")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Records the worker's heartbeat from its own timer, independent of the task queue."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs):
        self.tref = None

    def start(self, worker):
        from django.conf import settings

        self._beat()
        self.tref = worker.timer.call_repeatedly(settings.HEARTBEAT_INTERVAL, self._beat)

    def stop(self, worker):
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    @staticmethod
    def _beat():
        from django.db import close_old_connections

        from console.services import heartbeat_record

        close_old_connections()
        try:
            heartbeat_record(component="worker")
        except Exception:  # a DB blip must not kill the worker's timer; /healthz shows it
            import logging

            logging.getLogger(__name__).exception("worker heartbeat failed")


app.steps["worker"].add(WorkerHeartbeat)


@signals.worker_process_init.connect  # each prefork child, once Django is loaded
@signals.worker_init.connect  # the main process (the solo and threads pools run tasks there)
def _tune_garbage_collector(**kwargs) -> None:
    from console.gc_tuning import tune_garbage_collector

    tune_garbage_collector()
