"""Background components (worker, beat, watcher) note that they are alive; /healthz
reads it (console.selectors.heartbeat_status)."""

from __future__ import annotations

import os
import socket

from django.db import IntegrityError, transaction
from django.utils import timezone

from console.models import Heartbeat


def heartbeat_record(*, component: str) -> None:
    """Note that a background component is alive (read by /healthz)."""
    now = timezone.now()
    updated = Heartbeat.objects.filter(component=component).update(
        last_seen=now, hostname=socket.gethostname(), pid=os.getpid()
    )
    if not updated:
        try:
            with transaction.atomic():
                Heartbeat.objects.create(
                    component=component,
                    last_seen=now,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                )
        except IntegrityError:  # created concurrently by a second process of this component
            Heartbeat.objects.filter(component=component).update(last_seen=now)
