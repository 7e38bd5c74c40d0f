"""The Celery app. Its worker heartbeat (console/worker.py) needs Django, so
ConsoleConfig.ready() adds it to the worker's steps."""

from __future__ import annotations

import os

from celery import Celery, signals

from console.gc_tuning import tune_garbage_collector

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("gpugeek")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_process_init.connect  # each prefork child, once Django is loaded
@signals.worker_init.connect  # the main process (the solo and threads pools run tasks there)
def _tune_garbage_collector(**kwargs) -> None:
    tune_garbage_collector()
