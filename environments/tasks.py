"""Celery tasks of environments: thin."""

from __future__ import annotations

from celery import shared_task

from environments import services


@shared_task(acks_late=True)
def environments_sync_task() -> None:
    services.environments_sync_active()


@shared_task(acks_late=True)
def environments_delete_task() -> None:
    services.environments_delete_long_stopped()


@shared_task(acks_late=True)
def environments_keys_refresh_task(tenant_ids: list[int]) -> None:
    services.environments_keys_refresh(tenant_ids=tenant_ids)
