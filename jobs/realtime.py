"""The one place that publishes to channel groups: `job.<id>` and `tenant.<id>`.

Publishing never breaks the caller: a Redis outage loses a live update (the page catches
up on reconnect), never a state change. Sends happen after the transaction commits.
"""

from __future__ import annotations

import logging
from typing import TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)


class JobStatusMessage(TypedDict):
    type: str  # "status"
    job_id: int
    status: str
    status_reason: str
    attempt: int
    at: str


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}"


def _send(group: str, message: dict) -> None:
    try:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(group, {"type": "relay", "payload": message})
    except Exception:
        log.warning("realtime publish to %s failed", group, exc_info=True)


def publish_job_status(job) -> None:
    message = JobStatusMessage(
        type="status",
        job_id=job.pk,
        status=job.status,
        status_reason=job.status_reason,
        attempt=job.attempt,
        at=job.status_changed_at.isoformat(),
    )
    tenant_id = job.tenant_id

    def send() -> None:
        _send(job_group(job.pk), dict(message))
        _send(tenant_group(tenant_id), dict(message))

    transaction.on_commit(send)
