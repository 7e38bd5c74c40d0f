"""Writes for the marketplace, one module per concern:

- `capacity`: `capacity_sync`, the backends' node pools refreshed from their inventory,
  leaving out suspect nodes (`node_mark_suspect`, `node_clear_suspect`);
- `price_book`: the price book (preview, publish, withdraw) and tenant discounts;
- `catalog`: staff edits of GPU types and node pools, and tenant quotas;
- `images`: the registry allow-list, public and private images, registry logins.

Every staff change is audit-logged in the same transaction. Callers import from here.
"""

from marketplace.services.capacity import capacity_sync, node_clear_suspect, node_mark_suspect
from marketplace.services.catalog import (
    GPU_TYPE_EDITABLE_FIELDS,
    NODE_POOL_EDITABLE_FIELDS,
    gpu_type_update,
    new_tenant_limits_apply,
    new_tenant_policy_set,
    node_pool_update,
    tenant_quota_set,
)
from marketplace.services.images import (
    COMPATIBLE_VALUES,
    IMAGE_FIELDS,
    allowed_registry_add,
    allowed_registry_remove,
    image_create,
    image_deactivate,
    image_validate_reference,
    registry_credential_delete,
    registry_credential_set,
    registry_normalise,
)
from marketplace.services.price_book import (
    PreviewRow,
    PriceBookPreview,
    PriceRow,
    price_version_preview,
    price_version_publish,
    price_version_withdraw,
    storage_price_per_gib_hour,
    storage_price_per_gib_month,
    tenant_pricing_set,
)

__all__ = [
    "COMPATIBLE_VALUES",
    "GPU_TYPE_EDITABLE_FIELDS",
    "IMAGE_FIELDS",
    "NODE_POOL_EDITABLE_FIELDS",
    "PreviewRow",
    "PriceBookPreview",
    "PriceRow",
    "allowed_registry_add",
    "allowed_registry_remove",
    "capacity_sync",
    "gpu_type_update",
    "image_create",
    "image_deactivate",
    "image_validate_reference",
    "new_tenant_limits_apply",
    "new_tenant_policy_set",
    "node_clear_suspect",
    "node_mark_suspect",
    "node_pool_update",
    "price_version_preview",
    "price_version_publish",
    "price_version_withdraw",
    "registry_credential_delete",
    "registry_credential_set",
    "registry_normalise",
    "storage_price_per_gib_hour",
    "storage_price_per_gib_month",
    "tenant_pricing_set",
    "tenant_quota_set",
]
