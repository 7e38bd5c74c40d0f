"""Celery tasks of services: thin, each calls one function of services.reconcile."""

from __future__ import annotations

from celery import shared_task

from services import reconcile


@shared_task(acks_late=True)
def service_reconcile_task(service_id: int) -> None:
    reconcile.service_reconcile(service_id=service_id)


@shared_task(acks_late=True)
def services_reconcile_task() -> None:
    reconcile.services_reconcile_all()


@shared_task(acks_late=True)
def service_replica_discard_task(handle: str) -> None:
    reconcile.replica_discard(handle)
