"""The Celery worker's heartbeat, which lets /healthz see a dead worker.

It writes a model, so it needs Django set up: console/celery.py names this step by its
path, and Celery imports it when a worker builds its blueprint, after its Django fixup
has run django.setup().
"""

from __future__ import annotations

import logging

from celery import bootsteps
from django.conf import settings
from django.db import close_old_connections

from console.heartbeats import heartbeat_record

logger = logging.getLogger(__name__)


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Records the worker's heartbeat from its own timer, independent of the task queue."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs):
        self.tref = None

    def start(self, worker):
        self._beat()
        self.tref = worker.timer.call_repeatedly(settings.HEARTBEAT_INTERVAL, self._beat)

    def stop(self, worker):
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    @staticmethod
    def _beat():
        close_old_connections()
        try:
            heartbeat_record(component="worker")
        except Exception:  # a DB blip must not kill the worker's timer; /healthz shows it
            logger.exception("worker heartbeat failed")
