"""The staff catalog: hand edits of GPU types and node pools (not their capacity, which
`capacity_sync` owns), tenants' quotas per GPU type and the quota a new organisation
starts with. Every change is audit-logged in the same transaction.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import transaction
from django.http import HttpRequest

from console.models import Tenant, User
from console.service_errors import ServiceError
from console.services.audit import audit_record
from marketplace.models import GpuType, NewTenantPolicy, NodePool, TenantQuota
from marketplace.selectors import new_tenant_policy

# --- GPU types and node pools ----

# What staff may edit by hand; capacity fields belong to the capacity sync.
GPU_TYPE_EDITABLE_FIELDS = (
    "model",
    "vendor",
    "memory_gib",
    "architecture",
    "interconnect",
    "peak_tflops",
    "node_label_key",
    "node_label_value",
    "resource_name",
    "nvml_names",
    "is_active",
)
NODE_POOL_EDITABLE_FIELDS = (
    "name",
    "tier",
    "node_selector",
    "is_active",
    "preemption_threshold",
    "preempt_other_tenants_spot",
    "memory_margin",
    "runtime_class_name",
    "locality_weight",
    "topology_label",
)

# A pool's node selector goes into its pods' specs, matched against Kubernetes node
# labels, so it takes their syntax: a value is up to 63 characters of letters, digits,
# "-", "_" and ".", beginning and ending with a letter or digit (or empty); a key is a
# name like that (not empty), optionally after a DNS-subdomain prefix and "/".
LABEL_VALUE = r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
LABEL_KEY = (
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
NODE_SELECTOR_MAX_LABELS = 20


# A RuntimeClass name is a DNS label here (Kubernetes allows a subdomain; 63 is the
# field's length): lowercase letters, digits and "-", beginning and ending alphanumeric.
RUNTIME_CLASS = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def runtime_class_check(name: object) -> None:
    """Refuse a RuntimeClass name Kubernetes wouldn't take (ServiceError on the field)."""
    if not isinstance(name, str) or (name and not RUNTIME_CLASS.fullmatch(name)):
        raise ServiceError(
            "A runtime class is a Kubernetes name: up to 63 lowercase letters, digits and "
            '"-", beginning and ending with a letter or digit (e.g. kata or gvisor), or '
            "empty for the nodes' default runtime.",
            field="runtime_class_name",
        )


def node_selector_check(selector: object) -> None:
    """Refuse a node selector Kubernetes wouldn't take (ServiceError on `node_selector`)."""

    def refuse(message: str) -> ServiceError:
        return ServiceError(message, field="node_selector")

    if not isinstance(selector, dict):
        raise refuse('A node selector maps label keys to values, e.g. {"pool": "h100"}.')
    if len(selector) > NODE_SELECTOR_MAX_LABELS:
        raise refuse(f"At most {NODE_SELECTOR_MAX_LABELS} labels in a node selector.")
    for key, value in selector.items():
        if not re.match(LABEL_KEY, key) or len(key.rpartition("/")[0]) > 253:
            raise refuse(f"{key!r} is not a Kubernetes label key (e.g. “nvidia.com/gpu.product”).")
        if not isinstance(value, str) or not re.match(LABEL_VALUE, value):
            raise refuse(f"{value!r} is not a Kubernetes label value (63 characters at most).")


def _catalog_row_update(
    *,
    row: GpuType | NodePool,
    changes: dict[str, Any],
    editable: tuple[str, ...],
    action: str,
    user: User,
    request: HttpRequest | None,
) -> None:
    unknown = set(changes) - set(editable)
    if unknown:
        raise ServiceError(f"These fields can't be edited here: {', '.join(sorted(unknown))}.")
    for name, value in changes.items():
        setattr(row, name, value)
    if changes:
        row.save(update_fields=list(changes))
    audit_record(
        action=action,
        actor=user,
        target=row,
        request=request,
        metadata={"changed": list(changes)},
    )


@transaction.atomic
def gpu_type_update(
    *,
    gpu_type: GpuType,
    changes: dict[str, Any],
    user: User,
    request: HttpRequest | None = None,
) -> GpuType:
    """Staff edit of a GPU type's catalog fields (prices are versioned, not edited here)."""
    _catalog_row_update(
        row=gpu_type,
        changes=changes,
        editable=GPU_TYPE_EDITABLE_FIELDS,
        action="gpu_type.changed",
        user=user,
        request=request,
    )
    return gpu_type


@transaction.atomic
def node_pool_update(
    *,
    pool: NodePool,
    changes: dict[str, Any],
    user: User,
    request: HttpRequest | None = None,
) -> NodePool:
    """Staff edit of a pool's name, tier, node selector or availability; its capacity is
    written only by `capacity_sync`."""
    if "node_selector" in changes:
        node_selector_check(changes["node_selector"])
    if "runtime_class_name" in changes:
        runtime_class_check(changes["runtime_class_name"])
    if "topology_label" in changes and not re.fullmatch(LABEL_KEY, changes["topology_label"]):
        raise ServiceError(
            "The topology label is a Kubernetes label key, e.g. topology.kubernetes.io/zone "
            "or a rack label such as example.com/rack.",
            field="topology_label",
        )
    _catalog_row_update(
        row=pool,
        changes=changes,
        editable=NODE_POOL_EDITABLE_FIELDS,
        action="node_pool.changed",
        user=user,
        request=request,
    )
    return pool


# --- tenant quotas ----


@transaction.atomic
def tenant_quota_set(
    *,
    tenant: Tenant,
    gpu_type: GpuType | None,
    max_gpus: int | None,
    max_concurrent_jobs: int | None,
    user: User,
    max_storage_gib: int | None = None,
    request: HttpRequest | None = None,
) -> TenantQuota | None:
    """Set (or clear, with every limit empty) one quota row of a tenant."""
    limits = {
        "max_gpus": max_gpus,
        "max_concurrent_jobs": max_concurrent_jobs,
        "max_storage_gib": max_storage_gib,
    }
    for field, value in limits.items():
        if value is not None and value < 0:
            raise ServiceError("Limits can't be negative.", field=field)
    if gpu_type is not None and max_concurrent_jobs is not None:
        raise ServiceError(
            "Concurrent jobs are limited tenant-wide, not per GPU type.",
            field="max_concurrent_jobs",
        )
    if gpu_type is not None and max_storage_gib is not None:
        raise ServiceError(
            "Storage is limited tenant-wide, not per GPU type.", field="max_storage_gib"
        )
    quotas = TenantQuota.objects.for_tenant(tenant).filter(gpu_type=gpu_type)
    metadata: dict[str, Any] = {
        "gpu_type": gpu_type.slug if gpu_type else None,
        "max_gpus": max_gpus,
        "max_concurrent_jobs": max_concurrent_jobs,
        "max_storage_gib": max_storage_gib,
    }
    if all(value is None for value in limits.values()):
        quotas.delete()
        audit_record(
            action="tenant_quota.cleared",
            tenant=tenant,
            actor=user,
            target=tenant,
            request=request,
            metadata=metadata,
        )
        return None
    quota, _ = TenantQuota.objects.update_or_create(
        tenant=tenant,
        gpu_type=gpu_type,
        defaults=limits,
    )
    audit_record(
        action="tenant_quota.changed",
        tenant=tenant,
        actor=user,
        target=tenant,
        request=request,
        metadata=metadata,
    )
    return quota


# --- new organisations ----


@transaction.atomic
def new_tenant_policy_set(
    *,
    default_max_gpus: int | None,
    default_max_concurrent_jobs: int | None,
    require_credit: bool,
    user: User,
    request: HttpRequest | None = None,
) -> NewTenantPolicy:
    """Set what organisations created from now on start with (existing ones keep theirs)."""
    for field, value in (
        ("default_max_gpus", default_max_gpus),
        ("default_max_concurrent_jobs", default_max_concurrent_jobs),
    ):
        if value is not None and value < 0:
            raise ServiceError("Limits can't be negative.", field=field)
    policy, _ = NewTenantPolicy.objects.update_or_create(
        pk=1,
        defaults={
            "default_max_gpus": default_max_gpus,
            "default_max_concurrent_jobs": default_max_concurrent_jobs,
            "require_credit": require_credit,
            "updated_by": user,
        },
    )
    audit_record(
        action="new_tenant_policy.changed",
        actor=user,
        target=policy,
        request=request,
        metadata={
            "default_max_gpus": default_max_gpus,
            "default_max_concurrent_jobs": default_max_concurrent_jobs,
            "require_credit": require_credit,
        },
    )
    return policy


def new_tenant_limits_apply(*, tenant: Tenant) -> TenantQuota | None:
    """Give a new organisation the policy's tenant-wide quota (unless it has one)."""
    policy = new_tenant_policy()
    if policy.default_max_gpus is None and policy.default_max_concurrent_jobs is None:
        return None
    quota, created = TenantQuota.objects.get_or_create(
        tenant=tenant,
        gpu_type=None,
        defaults={
            "max_gpus": policy.default_max_gpus,
            "max_concurrent_jobs": policy.default_max_concurrent_jobs,
        },
    )
    if created:
        audit_record(
            action="tenant_quota.default_applied",
            tenant=tenant,
            actor_label="new organisation policy",
            target=tenant,
            metadata={
                "max_gpus": quota.max_gpus,
                "max_concurrent_jobs": quota.max_concurrent_jobs,
            },
        )
    return quota
