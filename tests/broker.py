"""The broker's edge in tests: tasks queued by console.queueing (`Task.apply_async`)
handed to a test's own worker, recorder or in-process run instead of Redis."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from celery import Task

from console.celery import app as celery_app

# What a test puts in the broker's place: (task, args, countdown) -> anything.
Send = Callable[[Task, tuple, float | None], Any]


def broker_replaced(monkeypatch, send: Send) -> None:
    """Every task queued from now on goes to `send` (the worker's autodiscovery first, so
    tasks are registered as in a worker)."""
    celery_app.loader.import_default_modules()

    def apply_async(task: Task, args=None, kwargs=None, countdown=None, **options):
        assert not kwargs, f"{task.name} was queued with keyword arguments"
        return send(task, tuple(args or ()), countdown)

    monkeypatch.setattr(Task, "apply_async", apply_async)


def run_body(task: Task, args: tuple) -> Any:
    """The task's own body, without Celery's wrappers (autoretry, request context); a
    bound task gets itself, with no request id."""
    body = task.__wrapped__
    if next(iter(inspect.signature(body).parameters), None) == "self":
        return body(task, *args)
    return body(*args)
