"""Fixtures of the console shell's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def worker_outbox(mailoutbox, tasks_in_process):
    """E-mail as the worker would send it: what the real `send_email_task` sends lands in
    Django's test outbox. Services queue mail after commit, so wrap the request in
    `django_capture_on_commit_callbacks(execute=True)`."""
    return mailoutbox
