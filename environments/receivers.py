"""Where environments listen to the rooms below them: a key added or deleted, a member
added, changed or removed, queues the publishing of keys to the organisations' running
environments (environments.services.keys). Connected once, from EnvironmentsConfig.ready()."""

from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save

from console.models import Membership, SshPublicKey
from console.queueing import enqueue_on_commit
from environments import tasks


def _refresh(tenant_ids: list[int]) -> None:
    if tenant_ids:
        enqueue_on_commit(tasks.environments_keys_refresh_task, sorted(set(tenant_ids)))


def key_changed(sender, instance: SshPublicKey, **kwargs) -> None:
    tenant_ids = Membership.objects.filter(user_id=instance.user_id).values_list(
        "tenant_id", flat=True
    )
    _refresh(list(tenant_ids))


def membership_changed(sender, instance: Membership, **kwargs) -> None:
    _refresh([instance.tenant_id])


def connect(config: AppConfig) -> None:
    for signal in (post_save, post_delete):
        signal.connect(key_changed, sender=SshPublicKey, dispatch_uid="environments-key")
        signal.connect(membership_changed, sender=Membership, dispatch_uid="environments-member")
