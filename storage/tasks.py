"""Celery tasks of storage: thin, each calls one service."""

from __future__ import annotations

from celery import shared_task

# The module, not names: services import this module to queue its task.
from storage import services
from storage.models import VolumeFill


@shared_task(acks_late=True)
def volume_fill_task(fill_id: int) -> None:
    fill = VolumeFill.objects.filter(pk=fill_id).select_related("volume__tenant").first()
    if fill is None:  # the volume was deleted meanwhile: nothing to copy into
        return
    services.volume_fill_run(fill=fill)
