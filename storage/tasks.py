"""Celery tasks of storage: thin, each calls one service."""

from __future__ import annotations

from celery import shared_task

# The module, not names: services import this module to queue its task.
from storage import services


@shared_task(acks_late=True)
def volume_fill_task(fill_id: int, attempt: int = 0) -> None:
    services.volume_fill_run(fill_id=fill_id, attempt=attempt)


@shared_task
def volume_fills_sweep_task() -> dict[str, int]:
    return services.volume_fills_sweep()
