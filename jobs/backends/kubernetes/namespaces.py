"""The tenant's namespace and what it holds for every job (quota, limits, policy)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.conf import settings

from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.client import (
    ApiCalls,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class NamespacesMixin(ApiCalls):
    # --- lifecycle ----------------------------------------------------------------------------
    def ensure_namespace(self, tenant_id: int) -> str:
        """The tenant's namespace with its quota, limits and network policy (idempotent;
        the quota follows the tenant's current TenantQuota rows)."""
        from marketplace.models import GpuType, TenantQuota

        quotas = list(TenantQuota.objects.filter(tenant_id=tenant_id))
        gpu_resources: dict[str, list[int]] = {}
        for gpu_type_id, resource in GpuType.objects.filter(is_active=True).values_list(
            "pk", "resource_name"
        ):
            gpu_resources.setdefault(resource, []).append(gpu_type_id)
        namespace, quota, limit_range, network_policy = manifests.namespace_manifests(
            tenant_id, quotas, gpu_resources
        )
        name = namespace["metadata"]["name"]
        self._create(f"namespace {name}", self.core.create_namespace, namespace)
        if (
            self._create(
                f"resource quota in {name}", self.core.create_namespaced_resource_quota, name, quota
            )
            is None
        ):
            self._call(
                f"updating the resource quota in {name}",
                self.core.patch_namespaced_resource_quota,
                quota["metadata"]["name"],
                name,
                [{"op": "add", "path": "/spec/hard", "value": quota["spec"]["hard"]}],
            )
        self._create(
            f"limit range in {name}", self.core.create_namespaced_limit_range, name, limit_range
        )
        self._create(
            f"network policy in {name}",
            self.networking.create_namespaced_network_policy,
            name,
            network_policy,
        )
        queue = self.kueue_queue()
        if queue:
            local_queue = manifests.local_queue_manifest(
                tenant_id, queue, settings.KUEUE_CLUSTER_QUEUE
            )
            self._create(
                f"Kueue LocalQueue in {name}",
                self.custom.create_namespaced_custom_object,
                manifests.KUEUE_GROUP,
                manifests.KUEUE_VERSION,
                name,
                "localqueues",
                local_queue,
            )
        return name
