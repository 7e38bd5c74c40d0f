"""Tasks are queued by name (console.queueing): every name the code queues must be a
task the worker registers, or the message would be dropped as unregistered."""

from __future__ import annotations

import re
from pathlib import Path

from console.celery import app
from console.queueing import enqueue_now

ROOT = Path(__file__).resolve().parents[2]
QUEUED = re.compile(r"""enqueue_(?:on_commit|now)\(\s*["']([\w.]+)["']""")


def queued_task_names() -> set[str]:
    names = set()
    for app_dir in ("console", "marketplace", "jobs", "billing"):
        for path in (ROOT / app_dir).rglob("*.py"):
            names |= set(QUEUED.findall(path.read_text()))
    return names


def test_every_queued_name_is_a_registered_task():
    app.loader.import_default_modules()  # what a worker does at start (autodiscovery)
    names = queued_task_names()
    assert "jobs.tasks.job_dispatch_task" in names  # the scan finds the calls
    assert sorted(names - set(app.tasks)) == []


def test_a_broker_outage_is_reported_not_raised(settings, monkeypatch):
    def refuse(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(app, "send_task", refuse)
    assert enqueue_now("jobs.tasks.job_dispatch_task", 1) is False
