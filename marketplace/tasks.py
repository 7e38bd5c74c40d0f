"""Celery tasks of the marketplace: thin, each calls one service."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from jobs.backends import BackendUnavailable, get_backend
from marketplace import services

log = logging.getLogger(__name__)


@shared_task(acks_late=True)
def capacity_sync_task() -> None:
    """Refresh every configured backend's pools; one unreachable backend doesn't stop the
    others, and its pools keep their last known capacity until it answers again."""
    for name in settings.COMPUTE_BACKENDS:
        try:
            services.capacity_sync(backend=get_backend(name))
        except BackendUnavailable as error:
            log.warning("capacity sync of %s failed: %s", name, error)
