"""The Celery app. Its worker heartbeat (console/worker.py) writes a model, so it is
named here and imported by Celery when a worker builds its steps, after Celery's Django
fixup has set Django up (this module is imported before that, by console/__init__)."""

from __future__ import annotations

import os

from celery import Celery, signals

from console.gc_tuning import tune_garbage_collector

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("gpugeek")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.steps["worker"].add("console.worker:WorkerHeartbeat")


@signals.worker_process_init.connect  # each prefork child, once Django is loaded
@signals.worker_init.connect  # the main process (the solo and threads pools run tasks there)
def _tune_garbage_collector(**kwargs) -> None:
    tune_garbage_collector()
