"""Where services plug into the rooms below them: their scrape-time metrics (replicas by
state, the wanted count) on /metrics, and dropping what the gateway keeps of a service
(services.selectors) when it, its replicas, its tokens or its organisation change, and
refusing to delete a volume that replicas mount.
Connected once, from ServicesConfig.ready()."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save

from console.metrics import scrape_collector_register
from console.models import Tenant
from console.service_errors import ErrorCode, ServiceError
from services import selectors
from services.models import Service, ServiceReplica, ServiceToken
from services.prometheus import ServicesCollector
from storage.models import Volume
from storage.signals import volume_deleting


def _service_changed(sender, instance: Service, **kwargs) -> None:
    selectors.routes_forget(service_ids=[instance.pk])


def _replica_changed(sender, instance: ServiceReplica, **kwargs) -> None:
    selectors.routes_forget(service_ids=[instance.service_id])


def _token_changed(sender, instance: ServiceToken, **kwargs) -> None:
    selectors.token_forget(service_id=instance.service_id, key_hash=instance.key_hash)


def _tenant_changed(sender, instance: Tenant, created: bool, **kwargs) -> None:
    if not created:  # (deactivated: its services answer 404 from now on)
        ids = Service.objects.filter(tenant_id=instance.pk).values_list("pk", flat=True)
        selectors.routes_forget(service_ids=list(ids))


def _volume_deleting(sender, volume: Volume, **kwargs) -> None:
    """A volume a service's replicas mount stays until the service stops mounting it."""
    users = selectors.services_mounting(volume=volume)
    if users:
        names = ", ".join(f"“{service.name}”" for service in users[:3])
        raise ServiceError(
            f"Volume {volume.name} is mounted by the replicas of service {names}; change "
            "the service's volumes (or delete it) first.",
            code=ErrorCode.CONFLICT,
        )


def connect() -> None:
    scrape_collector_register("services", ServicesCollector())
    for signal in (post_save, post_delete):
        signal.connect(_service_changed, sender=Service, dispatch_uid="services-route")
        signal.connect(_replica_changed, sender=ServiceReplica, dispatch_uid="services-route")
        signal.connect(_token_changed, sender=ServiceToken, dispatch_uid="services-token")
    post_save.connect(_tenant_changed, sender=Tenant, dispatch_uid="services-route")
    volume_deleting.connect(_volume_deleting, sender=Volume, dispatch_uid="services-volumes")
