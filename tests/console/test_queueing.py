"""Tasks are queued as task objects (console.queueing); the only task names written as
strings are Celery's own configuration (the beat schedule), which must name registered
tasks or beat would send messages no worker takes."""

from __future__ import annotations

import pytest
from celery import Task
from django.conf import settings

from console.celery import app
from console.queueing import enqueue_now, enqueue_on_commit
from jobs import tasks
from tests.broker import broker_replaced


def test_every_scheduled_task_is_registered():
    app.loader.import_default_modules()  # what a worker does at start (autodiscovery)
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert "jobs.tasks.jobs_reconcile_task" in scheduled
    assert sorted(scheduled - set(app.tasks)) == []


def test_a_broker_outage_is_reported_not_raised(monkeypatch):
    def refuse(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(Task, "apply_async", refuse)
    assert enqueue_now(tasks.jobs_dispatch_task) is False


def test_the_task_its_arguments_and_countdown_reach_the_broker(monkeypatch):
    sent = []
    broker_replaced(monkeypatch, lambda task, args, countdown: sent.append((task, args, countdown)))
    assert enqueue_now(tasks.job_cancel_task, 7) is True
    assert enqueue_now(tasks.jobs_dispatch_task, countdown=2.5) is True
    assert sent == [(tasks.job_cancel_task, (7,), None), (tasks.jobs_dispatch_task, (), 2.5)]


@pytest.mark.django_db
def test_on_commit_sends_only_after_the_commit(monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    broker_replaced(monkeypatch, lambda task, args, countdown: sent.append((task.name, args)))
    with django_capture_on_commit_callbacks(execute=True):
        enqueue_on_commit(tasks.job_release_task, 3)
        assert sent == []
    assert sent == [("jobs.tasks.job_release_task", (3,))]
