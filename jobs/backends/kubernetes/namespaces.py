"""The tenant's namespace and what it holds for every job (quota, limits, policy)."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time

from django.conf import settings

from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.client import (
    ApiCalls,
)
from marketplace.models import GpuType, TenantQuota

log = logging.getLogger(__name__)

# Tenant namespaces this process set up, and verified as this installation's, lately:
# by (API server, tenant) the fingerprint of the manifests applied and when. Launches in
# a burst then skip the namespace-level creates and the ownership reads their 409s need.
# Changed quotas change the fingerprint (set up again); any failure while starting an
# attempt forgets the entry, so a retry sets everything up again.
NAMESPACE_RECHECK_SECONDS = 30.0
_recently_ensured: dict[tuple[str, int], tuple[str, float]] = {}
_recently_ensured_lock = threading.Lock()
# API servers (and whether with Kueue's classes) this process made our priority classes
# on: they never change, so once per process is enough.
_priority_classes_on: set[tuple[str, bool]] = set()


def namespaces_forget_all() -> None:
    """Forget every namespace set up lately (a new cluster behind the same address)."""
    with _recently_ensured_lock:
        _recently_ensured.clear()
        _priority_classes_on.clear()


class NamespacesMixin(ApiCalls):
    # --- lifecycle ----------------------------------------------------------------------------
    def ensure_namespace(self, tenant_id: int) -> str:
        """The tenant's namespace with its quota, limits and network policy (idempotent;
        the quota follows the tenant's current TenantQuota rows)."""
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
        queue = self.kueue_queue()
        self.ensure_priority_classes(kueue=bool(queue))
        local_queue = (
            manifests.local_queue_manifest(tenant_id, queue, settings.KUEUE_CLUSTER_QUEUE)
            if queue
            else None
        )
        key = (self.api_client.configuration.host, tenant_id)
        fingerprint = hashlib.sha256(
            json.dumps(
                [namespace, quota, limit_range, network_policy, local_queue],
                sort_keys=True,
                default=str,
            ).encode()
        ).hexdigest()
        with _recently_ensured_lock:
            seen = _recently_ensured.get(key)
        if (
            seen
            and seen[0] == fingerprint
            and time.monotonic() - seen[1] < NAMESPACE_RECHECK_SECONDS
        ):
            return name
        self._create(f"namespace {name}", self.core.create_namespace, namespace)
        if not self._create(
            f"resource quota in {name}", self.core.create_namespaced_resource_quota, name, quota
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
        if local_queue is not None:
            self._create(
                f"Kueue LocalQueue in {name}",
                self.custom.create_namespaced_custom_object,
                manifests.KUEUE_GROUP,
                manifests.KUEUE_VERSION,
                name,
                "localqueues",
                local_queue,
            )
        with _recently_ensured_lock:
            _recently_ensured[key] = (fingerprint, time.monotonic())
        return name

    def ensure_priority_classes(self, *, kueue: bool) -> None:
        """The PriorityClasses our pods name (a pod naming a missing one is refused), and
        Kueue's WorkloadPriorityClasses where Kueue admits our jobs; cluster-scoped,
        made once per process and API server."""
        key = (self.api_client.configuration.host, kueue)
        with _recently_ensured_lock:
            if key in _priority_classes_on:
                return
        for manifest in manifests.priority_class_manifests():
            self._create_shared(
                f"PriorityClass {manifest['metadata']['name']}",
                self.scheduling.create_priority_class,
                manifest,
            )
        if kueue:
            for manifest in manifests.workload_priority_class_manifests():
                self._create_shared(
                    f"Kueue WorkloadPriorityClass {manifest['metadata']['name']}",
                    self.custom.create_cluster_custom_object,
                    manifests.KUEUE_GROUP,
                    manifests.KUEUE_VERSION,
                    "workloadpriorityclasses",
                    manifest,
                )
        with _recently_ensured_lock:
            _priority_classes_on.add(key)

    def forget_namespace(self, tenant_id: int) -> None:
        """Set the tenant's namespace up again at the next attempt (after a failure)."""
        with _recently_ensured_lock:
            _recently_ensured.pop((self.api_client.configuration.host, tenant_id), None)
