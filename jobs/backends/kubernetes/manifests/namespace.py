"""The tenant's namespace: Pod Security "restricted", a ResourceQuota from the
tenant's quota, a LimitRange and a default-deny NetworkPolicy (egress only as configured).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from jobs.backends.kubernetes.manifests.names import (
    DEFAULT_EGRESS_DENY_CIDRS,
    TENANT_LABEL,
    managed_labels,
    namespace_name,
    setting,
)
from jobs.checkpoints.store import checkpoint_store

if TYPE_CHECKING:
    from marketplace.models import TenantQuota

log = logging.getLogger(__name__)

# --- the tenant's namespace --------------------------------------------------------------


def namespace_manifest(tenant_id: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace_name(tenant_id),
            "labels": {
                **managed_labels(),
                TENANT_LABEL: str(tenant_id),
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/audit": "restricted",
            },
        },
    }


def quota_hard(quotas: list[TenantQuota], gpu_resources: dict[str, list[int]]) -> dict[str, str]:
    """ResourceQuota `hard` limits from the tenant's quotas.

    `gpu_resources` maps each GPU resource name (nvidia.com/gpu, …) to the ids of the GPU
    types using it. A ResourceQuota can't tell GPU products apart, so per resource the
    limit is the tenant-wide GPU quota, or else the sum of the per-type quotas when every
    type of that resource has one; otherwise that resource is left to our admission
    service (which enforces the per-type quotas exactly). This is a backstop, not the
    primary check. Jobs are counted per tier Job, and finished Jobs count until their TTL
    removes them, hence twice the concurrent-jobs quota.
    """
    hard: dict[str, str] = {}
    tenant_wide = next((q for q in quotas if q.gpu_type_id is None), None)
    per_type = {q.gpu_type_id: q.max_gpus for q in quotas if q.gpu_type_id is not None}
    for resource, type_ids in sorted(gpu_resources.items()):
        limit = None
        if tenant_wide is not None and tenant_wide.max_gpus is not None:
            limit = tenant_wide.max_gpus
        elif type_ids and all(per_type.get(t) is not None for t in type_ids):
            limit = sum(per_type[t] for t in type_ids)
        if limit is not None:
            hard[f"requests.{resource}"] = str(limit)
    if tenant_wide is not None and tenant_wide.max_concurrent_jobs is not None:
        hard["count/jobs.batch"] = str(2 * tenant_wide.max_concurrent_jobs)
    return hard


def resource_quota_manifest(tenant_id: int, hard: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": "gpugeek-quota",
            "namespace": namespace_name(tenant_id),
            "labels": {**managed_labels(), TENANT_LABEL: str(tenant_id)},
        },
        "spec": {"hard": hard},
    }


def limit_range_manifest(tenant_id: int) -> dict:
    """Defaults for any container that states no resources (ours always do)."""
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {
            "name": "gpugeek-defaults",
            "namespace": namespace_name(tenant_id),
            "labels": {**managed_labels(), TENANT_LABEL: str(tenant_id)},
        },
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "default": {"cpu": "1", "memory": "2Gi"},
                    "defaultRequest": {"cpu": "100m", "memory": "256Mi"},
                }
            ]
        },
    }


def _deny_cidrs() -> tuple[list[str], list[str]]:
    v4, v6 = [], []
    for cidr in setting("KUBERNETES_EGRESS_DENY_CIDRS", DEFAULT_EGRESS_DENY_CIDRS):
        network = ipaddress.ip_network(cidr, strict=False)
        (v4 if network.version == 4 else v6).append(str(network))
    return v4, v6


def _host_addresses(host: str, port: int) -> list[str]:
    """The host's addresses (itself when it is one); none when it doesn't resolve now."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        log.warning("%s does not resolve (no egress rule for it): %s", host, error)
        return []
    return sorted({str(ipaddress.ip_address(entry[4][0])) for entry in found})


def _address_rule(host: str, port: int) -> dict | None:
    """Egress to each address of `host` as a single-address ipBlock, on `port` alone."""
    addresses = _host_addresses(host, port)
    if not addresses:
        return None
    blocks = [
        {"ipBlock": {"cidr": f"{address}/{ipaddress.ip_address(address).max_prefixlen}"}}
        for address in addresses
    ]
    return {"to": blocks, "ports": [{"protocol": "TCP", "port": port}]}


def store_egress_rule() -> dict | None:
    """Egress to exactly the checkpoint store's address: each address of its endpoint
    host as a single-address ipBlock, on its one TCP port. It may lie in a denied CIDR
    (a MinIO inside the cluster's network), which this opens for that port alone."""
    endpoint = checkpoint_store().network_endpoint()
    if endpoint is None:
        return None
    return _address_rule(*endpoint)


def console_egress_rule() -> dict | None:
    """Egress to exactly the console's address as jobs reach it (CONSOLE_URL_FOR_JOBS),
    for their `checkpoint` events: a console inside the cluster's network lies in a
    denied CIDR, opened here for its one port alone. None when jobs get no such URL."""
    url = urlsplit(setting("CONSOLE_URL_FOR_JOBS", "") or "")
    if url.scheme not in ("http", "https") or not url.hostname:
        return None
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        log.warning("CONSOLE_URL_FOR_JOBS has no valid port: %s", url.geturl())
        return None
    return _address_rule(url.hostname, port)


def network_policy_manifest(tenant_id: int) -> dict:
    """Default deny. Ingress only from pods of the same namespace (rendezvous); egress to
    those pods, to the cluster DNS, to the checkpoint store's and the console's address
    and port, and to the internet except the denied CIDRs."""
    v4, v6 = _deny_cidrs()
    opened = [rule for rule in (store_egress_rule(), console_egress_rule()) if rule]
    internet: list[dict] = [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": v4}},
        {"ipBlock": {"cidr": "::/0", "except": v6}},
    ]
    for block in internet:
        if not block["ipBlock"]["except"]:
            del block["ipBlock"]["except"]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "gpugeek-default",
            "namespace": namespace_name(tenant_id),
            "labels": {**managed_labels(), TENANT_LABEL: str(tenant_id)},
        },
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
            "egress": [
                {"to": [{"podSelector": {}}]},
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                            },
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                        }
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
                *opened,
                {"to": internet},
            ],
        },
    }


def namespace_manifests(
    tenant_id: int, quotas: list[TenantQuota], gpu_resources: dict[str, list[int]]
) -> list[dict]:
    """The namespace and its guard rails, in creation order."""
    return [
        namespace_manifest(tenant_id),
        resource_quota_manifest(tenant_id, quota_hard(quotas, gpu_resources)),
        limit_range_manifest(tenant_id),
        network_policy_manifest(tenant_id),
    ]
