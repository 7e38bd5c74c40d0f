"""Celery tasks of services: thin, each calls one function of a reconcile module."""

from __future__ import annotations

from celery import shared_task

from console.queueing import enqueue_now
from jobs.backends import BackendUnavailable
from services import reconcile
from services.kubernetes import reconcile as kubernetes_reconcile


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


@shared_task(
    acks_late=True, autoretry_for=(BackendUnavailable,), retry_backoff=True, max_retries=12
)
def service_objects_delete_task(tenant_id: int, service_id: int) -> None:
    kubernetes_reconcile.service_objects_delete(tenant_id=tenant_id, service_id=service_id)
