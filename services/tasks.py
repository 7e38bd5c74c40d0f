"""Celery tasks of services: thin, each calls one function of services.reconcile."""

from __future__ import annotations

from celery import shared_task

from console.queueing import enqueue_now
from services import reconcile


@shared_task(acks_late=True)
def service_reconcile_task(service_id: int) -> None:
    service = reconcile.service_reconcile(service_id=service_id)
    if service is not None and reconcile.quick_pass_wanted(service):
        enqueue_now(service_reconcile_task, service_id, countdown=reconcile.QUICK_PASS_SECONDS)


@shared_task(acks_late=True)
def services_reconcile_task() -> None:
    reconcile.services_reconcile_all()


@shared_task(acks_late=True, expires=5)
def services_autoscale_task() -> None:
    for service_id in reconcile.services_autoscale_all():
        enqueue_now(service_reconcile_task, service_id)


@shared_task(acks_late=True)
def service_replica_discard_task(handle: str) -> None:
    reconcile.replica_discard(handle)
