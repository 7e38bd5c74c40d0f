"""Writes for the marketplace: capacity sync, price book, tenant pricing and quotas, images.

Every staff change is audit-logged in the same transaction.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from django.utils.text import slugify

from console.crypto import encrypt_json
from console.models import Tenant, User
from console.services import ServiceError, audit_record
from jobs.backends.base import ComputeBackend, NodeInventory
from marketplace.images import InvalidReference, is_allowed, parse_reference
from marketplace.models import (
    AllowedRegistry,
    GpuType,
    Image,
    NodePool,
    PriceEntry,
    PriceVersion,
    Region,
    RegistryCredential,
    TenantPricing,
    TenantQuota,
)
from marketplace.pricing import RESERVED_TERMS

log = logging.getLogger(__name__)


# --- capacity ----


def _match_gpu_type(node: NodeInventory, gpu_types: list[GpuType]) -> GpuType | None:
    if not node.gpu_product:
        return None
    for gpu_type in gpu_types:
        if node.labels.get(gpu_type.node_label_key) == gpu_type.node_label_value:
            return gpu_type
        # NVML says e.g. "NVIDIA L4" and "NVIDIA L40S": compare whole names, not substrings.
        reported = node.gpu_product.lower().removeprefix("nvidia ").strip()
        if reported in (name.lower() for name in gpu_type.nvml_names):
            return gpu_type
    return None


@dataclass
class _PoolCapacity:
    nodes: int = 0
    gpus_per_node: int = 0
    total_gpus: int = 0
    allocatable_gpus: int = 0
    in_use_gpus: int = 0
    vcpus_per_node: int = 0
    memory_gib_per_node: int = 0
    allocatable_vcpus: int = 0
    in_use_vcpus: int = 0


@transaction.atomic
def capacity_sync(*, backend: ComputeBackend, now: datetime | None = None) -> list[NodePool]:
    """Refresh the backend's pools from its inventory.

    Nodes group into pools by region × GPU type × tier; a pool is created the first time
    its kind of node appears, and drops to zero capacity when its nodes are gone.
    Raises BackendUnavailable (before writing anything) when the backend can't be reached.
    """
    now = now or timezone.now()
    nodes = backend.inventory()
    gpu_types = list(GpuType.objects.filter(is_active=True))
    regions = {region.slug: region for region in Region.objects.all()}
    grouped: dict[tuple[str, str | None, str], _PoolCapacity] = defaultdict(_PoolCapacity)
    for node in nodes:
        region = regions.get(node.region)
        if region is None:
            log.warning("node %s is in unknown region %r; skipped", node.name, node.region)
            continue
        gpu_type = _match_gpu_type(node, gpu_types)
        if node.gpu_product and gpu_type is None:
            log.warning("node %s has unknown GPU %r; skipped", node.name, node.gpu_product)
            continue
        capacity = grouped[(region.slug, gpu_type.slug if gpu_type else None, node.tier)]
        capacity.nodes += 1
        capacity.gpus_per_node = max(capacity.gpus_per_node, node.gpus_allocatable)
        capacity.total_gpus += node.gpus_allocatable
        if node.schedulable:
            capacity.allocatable_gpus += node.gpus_allocatable
            capacity.allocatable_vcpus += node.vcpus_allocatable
        capacity.in_use_gpus += node.gpus_in_use
        capacity.in_use_vcpus += node.vcpus_in_use
        capacity.vcpus_per_node = max(capacity.vcpus_per_node, node.vcpus_allocatable)
        capacity.memory_gib_per_node = max(capacity.memory_gib_per_node, node.memory_gib)

    gpu_by_slug = {gpu_type.slug: gpu_type for gpu_type in gpu_types}
    seen: list[NodePool] = []
    for (region_slug, gpu_slug, tier), capacity in grouped.items():
        slug = slugify(f"{backend.name}-{region_slug}-{gpu_slug or 'cpu'}-{tier}")
        slug = slug.replace("_", "-")
        pool, _ = NodePool.objects.select_for_update().get_or_create(
            slug=slug,
            defaults={
                "name": f"{gpu_by_slug[gpu_slug].model if gpu_slug else 'CPU'} · "
                f"{region_slug} · {tier.replace('_', '-')}",
                "region": regions[region_slug],
                "backend": backend.name,
                "tier": tier,
                "gpu_type": gpu_by_slug.get(gpu_slug) if gpu_slug else None,
            },
        )
        for name, value in vars(capacity).items():
            setattr(pool, "node_count" if name == "nodes" else name, value)
        pool.last_synced_at = now
        pool.save()
        seen.append(pool)
    # Pools whose nodes disappeared keep their row (jobs refer to them) but no capacity.
    NodePool.objects.filter(backend=backend.name).exclude(pk__in=[p.pk for p in seen]).update(
        node_count=0,
        total_gpus=0,
        allocatable_gpus=0,
        in_use_gpus=0,
        allocatable_vcpus=0,
        in_use_vcpus=0,
        last_synced_at=now,
    )
    return seen


# --- price book ----


@dataclass(frozen=True)
class PriceRow:
    gpu_type: GpuType | None
    region: Region
    on_demand_price: Decimal


@dataclass(frozen=True)
class PreviewRow:
    gpu_type: GpuType | None
    region: Region
    old_price: Decimal | None
    new_price: Decimal

    @property
    def change_percent(self) -> Decimal | None:
        if not self.old_price:
            return None
        return ((self.new_price - self.old_price) / self.old_price * 100).quantize(Decimal("0.1"))


def _validate_discounts(spot: Decimal, reserved: dict[int, Decimal]) -> None:
    for label, value in [("spot_discount_percent", spot)] + [
        (f"reserved_{m}m_discount_percent", v) for m, v in reserved.items()
    ]:
        if not Decimal(0) <= value < Decimal(100):
            raise ServiceError(
                "A discount is a percentage from 0 up to (not including) 100.", field=label
            )
    if set(reserved) != set(RESERVED_TERMS):
        raise ServiceError("Give a discount for each reserved term: 1, 3 and 12 months.")


def price_version_preview(*, rows: list[PriceRow], at: datetime | None = None) -> list[PreviewRow]:
    """The new table next to the one in force (nothing saved)."""
    current = PriceVersion.objects.in_force(at)
    old = {}
    if current is not None:
        old = {(e.gpu_type_id, e.region_id): e.on_demand_price for e in current.entries.all()}
    return [
        PreviewRow(
            gpu_type=row.gpu_type,
            region=row.region,
            old_price=old.get((row.gpu_type.pk if row.gpu_type else None, row.region.pk)),
            new_price=row.on_demand_price,
        )
        for row in rows
    ]


@transaction.atomic
def price_version_publish(
    *,
    effective_from: datetime,
    rows: list[PriceRow],
    spot_discount_percent: Decimal,
    reserved_discount_percent: dict[int, Decimal],
    user: User | None,
    currency: str = "USD",
    note: str = "",
    request: HttpRequest | None = None,
    now: datetime | None = None,
) -> PriceVersion:
    """Publish a complete, dated price table. Past times are refused: usage already
    rated must keep the price it ran at."""
    now = now or timezone.now()
    # A minute of slack: "now" typed in a form is a few moments old when it arrives.
    if effective_from < now - timezone.timedelta(seconds=60):
        raise ServiceError(
            "A new price version can't take effect in the past; pick now or a later time.",
            field="effective_from",
        )
    effective_from = max(effective_from, now)
    if not rows:
        raise ServiceError("A price version needs at least one price.")
    if len(currency) != 3 or not currency.isalpha():
        raise ServiceError("Currency is a three-letter ISO code such as USD.", field="currency")
    seen = set()
    for row in rows:
        if row.on_demand_price <= 0:
            raise ServiceError(
                f"The price of {row.gpu_type or 'CPU'} in {row.region.slug} must be above zero.",
                field="prices",
            )
        key = (row.gpu_type.pk if row.gpu_type else None, row.region.pk)
        if key in seen:
            raise ServiceError(
                f"{row.gpu_type or 'CPU'} in {row.region.slug} is priced twice.", field="prices"
            )
        seen.add(key)
    _validate_discounts(spot_discount_percent, reserved_discount_percent)
    version = PriceVersion.objects.create(
        currency=currency.upper(),
        effective_from=effective_from,
        spot_discount_percent=spot_discount_percent,
        reserved_1m_discount_percent=reserved_discount_percent[1],
        reserved_3m_discount_percent=reserved_discount_percent[3],
        reserved_12m_discount_percent=reserved_discount_percent[12],
        note=note,
        created_by=user,
    )
    PriceEntry.objects.bulk_create(
        [
            PriceEntry(
                version=version,
                gpu_type=row.gpu_type,
                region=row.region,
                on_demand_price=row.on_demand_price,
            )
            for row in rows
        ]
    )
    audit_record(
        action="price_version.published",
        actor=user,
        target=version,
        request=request,
        metadata={
            "effective_from": effective_from.isoformat(),
            "entries": len(rows),
            "spot_discount_percent": str(spot_discount_percent),
            "note": note,
        },
    )
    return version


@transaction.atomic
def price_version_withdraw(
    *, version: PriceVersion, user: User, request: HttpRequest | None = None
) -> None:
    """Withdraw a version that hasn't taken effect yet; one in force or past is history."""
    version = PriceVersion.objects.select_for_update().get(pk=version.pk)
    if not version.is_editable():
        raise ServiceError(
            "This price version has taken effect; it can't be changed. Publish "
            "a new version instead.",
            code="conflict",
        )
    audit_record(
        action="price_version.withdrawn",
        actor=user,
        target=version,
        request=request,
        metadata={"effective_from": version.effective_from.isoformat()},
    )
    version.delete()


# --- tenant pricing and quotas ----


@transaction.atomic
def tenant_pricing_set(
    *,
    tenant: Tenant,
    discount_percent: Decimal,
    note: str,
    user: User,
    request: HttpRequest | None = None,
) -> TenantPricing:
    if not Decimal(0) <= discount_percent < Decimal(100):
        raise ServiceError("A discount is a percentage from 0 up to 100.", field="discount_percent")
    pricing, _ = TenantPricing.objects.get_or_create(tenant=tenant)
    previous = pricing.discount_percent
    pricing.discount_percent = discount_percent
    pricing.note = note
    pricing.save()
    audit_record(
        action="tenant_pricing.changed",
        tenant=tenant,
        actor=user,
        target=tenant,
        request=request,
        metadata={"from": str(previous), "to": str(discount_percent), "note": note},
    )
    return pricing


@transaction.atomic
def tenant_quota_set(
    *,
    tenant: Tenant,
    gpu_type: GpuType | None,
    max_gpus: int | None,
    max_concurrent_jobs: int | None,
    user: User,
    request: HttpRequest | None = None,
) -> TenantQuota | None:
    """Set (or clear, with both limits empty) one quota row of a tenant."""
    for field, value in (("max_gpus", max_gpus), ("max_concurrent_jobs", max_concurrent_jobs)):
        if value is not None and value < 0:
            raise ServiceError("Limits can't be negative.", field=field)
    if gpu_type is not None and max_concurrent_jobs is not None:
        raise ServiceError(
            "Concurrent jobs are limited tenant-wide, not per GPU type.",
            field="max_concurrent_jobs",
        )
    quotas = TenantQuota.objects.for_tenant(tenant).filter(gpu_type=gpu_type)
    metadata: dict[str, Any] = {
        "gpu_type": gpu_type.slug if gpu_type else None,
        "max_gpus": max_gpus,
        "max_concurrent_jobs": max_concurrent_jobs,
    }
    if max_gpus is None and max_concurrent_jobs is None:
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
        defaults={"max_gpus": max_gpus, "max_concurrent_jobs": max_concurrent_jobs},
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


# --- images ----


def _allowed_registries() -> list[tuple[str, str]]:
    return list(AllowedRegistry.objects.values_list("host", "path_prefix"))


def image_validate_reference(*, reference: str, tenant: Tenant | None) -> str:
    """The normalised reference, or a ServiceError. Private images must come from an
    allow-listed registry."""
    try:
        parsed = parse_reference(reference)
    except InvalidReference as error:
        raise ServiceError(str(error), field="reference") from None
    if tenant is not None and not is_allowed(parsed, _allowed_registries()):
        raise ServiceError(
            f"Registry {parsed.registry} (path {parsed.path}) is not on the "
            "allow-list for private images; ask platform staff to add it.",
            field="reference",
        )
    return str(parsed)


IMAGE_FIELDS = (
    "name",
    "kind",
    "cuda_version",
    "rocm_version",
    "framework",
    "framework_version",
    "compatible_with",
    "size_gib",
    "description",
    "default_command",
    "ports",
)
COMPATIBLE_VALUES = {"nvidia", "amd", "huawei", "cpu"}


def _validate_image_fields(fields: dict[str, Any]) -> None:
    compatible = fields.get("compatible_with") or []
    if not compatible or not set(compatible) <= COMPATIBLE_VALUES:
        raise ServiceError(
            "Say which hardware it runs on: nvidia, amd, huawei and/or cpu.",
            field="compatible_with",
        )
    command = fields.get("default_command") or []
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise ServiceError(
            "The default command is a list of strings (no shell string).", field="default_command"
        )
    for port in fields.get("ports") or []:
        if (
            not isinstance(port, dict)
            or not str(port.get("name", "")).strip()
            or not isinstance(port.get("port"), int)
            or not 1 <= port["port"] <= 65535
        ):
            raise ServiceError(
                'Ports look like [{"name": "jupyter", "port": 8888}].', field="ports"
            )


@transaction.atomic
def image_create(
    *,
    tenant: Tenant | None,
    slug: str,
    reference: str,
    user: User,
    request: HttpRequest | None = None,
    **fields: Any,
) -> Image:
    """A public image (tenant None, staff) or a tenant's private image."""
    unknown = set(fields) - set(IMAGE_FIELDS)
    if unknown:
        raise ServiceError(f"Unknown image fields: {', '.join(sorted(unknown))}.")
    slug = slugify(slug)
    if not slug:
        raise ServiceError("Give the image a slug.", field="slug")
    _validate_image_fields(fields)
    normalised = image_validate_reference(reference=reference, tenant=tenant)
    clash = Image.objects.filter(slug=slug)
    clash = clash.filter(tenant=tenant) if tenant else clash.filter(tenant__isnull=True)
    if clash.exists():
        raise ServiceError(
            f"An image with slug “{slug}” exists already.", code="conflict", field="slug"
        )
    image = Image.objects.create(tenant=tenant, slug=slug, reference=normalised, **fields)
    audit_record(
        action="image.created",
        tenant=tenant,
        actor=user,
        target=image,
        request=request,
        metadata={"reference": normalised, "public": tenant is None},
    )
    return image


@transaction.atomic
def image_deactivate(*, image: Image, user: User, request: HttpRequest | None = None) -> Image:
    if image.is_active:
        image.is_active = False
        image.save(update_fields=["is_active"])
        audit_record(
            action="image.deactivated",
            tenant=image.tenant,
            actor=user,
            target=image,
            request=request,
        )
    return image


# --- registry credentials ----


def registry_normalise(registry: str) -> str:
    """host[:port] as image references name it (lower-case; docker.io for Docker Hub)."""
    text = (registry or "").strip().lower().removeprefix("https://").removeprefix("http://")
    text = text.rstrip("/")
    if text in ("index.docker.io", "registry-1.docker.io"):
        return "docker.io"
    return text


@transaction.atomic
def registry_credential_set(
    *,
    tenant: Tenant,
    user: User,
    registry: str,
    username: str,
    password: str,
    request: HttpRequest | None = None,
) -> RegistryCredential:
    """Store (or replace) the tenant's login to an allow-listed registry. The password is
    encrypted at once and never shown again; jobs started later pull with it."""
    host = registry_normalise(registry)
    if not host or host not in {h.lower() for h, _ in _allowed_registries()}:
        raise ServiceError(
            f"{host or 'That'} is not an allow-listed registry for private images.",
            field="registry",
        )
    username = (username or "").strip()
    if not username or len(username) > 200:
        raise ServiceError("Give the registry user name (up to 200 characters).", field="username")
    if not password:
        raise ServiceError("Give the password or access token.", field="password")
    credential, created = RegistryCredential.objects.update_or_create(
        tenant=tenant,
        registry=host,
        defaults={
            "username": username,
            "password_encrypted": encrypt_json({"password": password}),
            "created_by": user,
        },
    )
    audit_record(
        action="registry_credential.created" if created else "registry_credential.updated",
        tenant=tenant,
        actor=user,
        target=credential,
        request=request,
        metadata={"registry": host, "username": username},
    )
    return credential


@transaction.atomic
def registry_credential_delete(
    *, credential: RegistryCredential, user: User, request: HttpRequest | None = None
) -> None:
    audit_record(
        action="registry_credential.deleted",
        tenant=credential.tenant,
        actor=user,
        target=credential,
        request=request,
        metadata={"registry": credential.registry},
    )
    tenant_id, registry = credential.tenant_id, credential.registry
    credential.delete()
    if "kubernetes" in settings.COMPUTE_BACKENDS:
        # The login's copy in the tenant's namespace goes too (after commit, by a task).
        from jobs.tasks import registry_pull_secret_remove_task

        def send() -> None:
            try:
                registry_pull_secret_remove_task.delay(tenant_id, registry)
            except Exception:
                log.exception("could not queue the removal of the %s pull secret", registry)

        transaction.on_commit(send)
