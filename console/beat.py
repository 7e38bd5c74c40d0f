"""Celery beat's scheduler (imported by beat only, once Django is set up)."""

import logging

from django.conf import settings
from django.utils import timezone
from django_celery_beat.schedulers import DatabaseScheduler

from console.heartbeats import heartbeat_record

logger = logging.getLogger(__name__)


class HeartbeatDatabaseScheduler(DatabaseScheduler):
    """django-celery-beat's scheduler that also records beat's heartbeat on each tick."""

    def tick(self, *args, **kwargs):
        now = timezone.now()
        last = getattr(self, "_last_heartbeat", None)
        if last is None or (now - last).total_seconds() >= settings.HEARTBEAT_INTERVAL:
            try:
                heartbeat_record(component="beat")
                self._last_heartbeat = now
            except Exception:
                logger.exception("beat heartbeat failed")
        # Wake at least every heartbeat interval, even when no task is due.
        return min(super().tick(*args, **kwargs), settings.HEARTBEAT_INTERVAL)
