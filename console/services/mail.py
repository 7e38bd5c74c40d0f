"""E-mail, sent by the worker: invitations, verification links, notifications."""

from __future__ import annotations

from console import tasks
from console.queueing import enqueue_now


def email_send_later(*, subject: str, body: str, recipients: list[str]) -> bool:
    """Queue an e-mail for the worker. A broker outage must not fail the page that
    triggered it (the invitation link is also shown on screen), so it is logged instead."""
    return enqueue_now(tasks.send_email_task, subject, body, recipients)
