"""The price book: previewing, publishing and withdrawing dated price versions, and a
tenant's negotiated discount. Past prices are history: usage already rated keeps the
price it ran at. Every change is audit-logged in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from console.models import Tenant, User
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from marketplace.models import (
    HOURS_PER_MONTH,
    STORAGE_PRICE_PLACES,
    GpuType,
    PriceEntry,
    PriceVersion,
    Region,
    StoragePrice,
    TenantPricing,
)
from marketplace.pricing import RESERVED_TERMS


@dataclass(frozen=True)
class PriceRow:
    gpu_type: GpuType | None
    region: Region
    on_demand_price: Decimal


@dataclass(frozen=True)
class PreviewRow:
    """One offer whose price changes: new (no old price), repriced, or withdrawn (no
    new price: its cell was left empty)."""

    gpu_type: GpuType | None
    region: Region
    old_price: Decimal | None
    new_price: Decimal | None

    @property
    def change_percent(self) -> Decimal | None:
        if not self.old_price or self.new_price is None:
            return None
        return ((self.new_price - self.old_price) / self.old_price * 100).quantize(Decimal("0.1"))


@dataclass(frozen=True)
class StoragePreviewRow:
    """A region whose volume storage price changes (per GiB-hour; None: no price)."""

    region: Region
    old_price: Decimal | None
    new_price: Decimal | None

    @property
    def old_per_gib_month(self) -> Decimal | None:
        return None if self.old_price is None else storage_price_per_gib_month(self.old_price)

    @property
    def new_per_gib_month(self) -> Decimal | None:
        return None if self.new_price is None else storage_price_per_gib_month(self.new_price)


def storage_price_per_gib_hour(per_gib_month: Decimal) -> Decimal:
    """A storage price staff give per GiB-month, as kept: per GiB-hour of a 730-hour
    month, to the column's places."""
    return (per_gib_month / HOURS_PER_MONTH).quantize(Decimal(1).scaleb(-STORAGE_PRICE_PLACES))


def storage_price_per_gib_month(per_gib_hour: Decimal) -> Decimal:
    """A kept storage price per GiB-month, to 6 places: what staff typed when they set
    it (0.10 is kept as 0.000136986 an hour, which is 0.09999998 a month)."""
    return (per_gib_hour * HOURS_PER_MONTH).quantize(Decimal("0.000001")).normalize()


@dataclass(frozen=True)
class DiscountChange:
    label: str
    old_percent: Decimal | None
    new_percent: Decimal


@dataclass(frozen=True)
class PriceBookPreview:
    """What publishing would change against the version in force: only the offers whose
    price changes and the discounts that change; `unchanged` counts the rest."""

    rows: list[PreviewRow]
    discounts: list[DiscountChange]
    unchanged: int
    storage_rows: list[StoragePreviewRow] = field(default_factory=list)

    @property
    def changes_anything(self) -> bool:
        return bool(self.rows or self.discounts or self.storage_rows)


DISCOUNT_LABELS = {
    "spot_discount_percent": "Spot discount",
    "reserved_1m_discount_percent": "Reserved 1-month discount",
    "reserved_3m_discount_percent": "Reserved 3-month discount",
    "reserved_12m_discount_percent": "Reserved 12-month discount",
}


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


def price_version_preview(
    *,
    rows: list[PriceRow],
    spot_discount_percent: Decimal,
    reserved_discount_percent: dict[int, Decimal],
    at: datetime | None = None,
    storage_prices: dict[Region, Decimal] | None = None,
) -> PriceBookPreview:
    """What changes against the version in force at `at` (nothing saved); storage
    prices (per GiB-hour) only when `storage_prices` gives them."""
    current = PriceVersion.objects.in_force(at)
    entries = list(current.entries.select_related("gpu_type", "region")) if current else []
    old = {(e.gpu_type_id, e.region_id): e.on_demand_price for e in entries}
    new = {(r.gpu_type.pk if r.gpu_type else None, r.region.pk): r for r in rows}
    changed = [
        PreviewRow(row.gpu_type, row.region, old.get(key), row.on_demand_price)
        for key, row in new.items()
        if old.get(key) != row.on_demand_price
    ] + [
        PreviewRow(e.gpu_type, e.region, e.on_demand_price, None)
        for e in entries
        if (e.gpu_type_id, e.region_id) not in new
    ]
    proposed = {
        "spot_discount_percent": spot_discount_percent,
        **{f"reserved_{m}m_discount_percent": v for m, v in reserved_discount_percent.items()},
    }
    discounts = [
        DiscountChange(DISCOUNT_LABELS[name], getattr(current, name, None), value)
        for name, value in proposed.items()
        if current is None or getattr(current, name) != value
    ]
    storage_rows = []
    if storage_prices is not None:
        old_storage = (
            {
                p.region: p.price_per_gib_hour
                for p in current.storage_prices.select_related("region")
            }
            if current
            else {}
        )
        storage_rows = [
            StoragePreviewRow(region, old_storage.get(region), storage_prices.get(region))
            for region in sorted({*old_storage, *storage_prices}, key=lambda r: r.slug)
            if old_storage.get(region) != storage_prices.get(region)
        ]
    return PriceBookPreview(
        rows=sorted(changed, key=lambda r: (str(r.gpu_type or "CPU"), r.region.slug)),
        discounts=discounts,
        unchanged=len(new) - sum(1 for r in changed if r.new_price is not None),
        storage_rows=storage_rows,
    )


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
    storage_prices: dict[Region, Decimal] | None = None,
) -> PriceVersion:
    """Publish a complete, dated price table. Past times are refused: usage already
    rated must keep the price it ran at. Volume storage prices (per GiB-hour, by region)
    are the version in force's unless `storage_prices` gives them."""
    now = now or timezone.now()
    # A minute of slack: "now" typed in a form is a few moments old when it arrives.
    if effective_from < now - timedelta(seconds=60):
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
    if storage_prices is None:
        current = PriceVersion.objects.in_force(now)
        storage_prices = (
            {price.region: price.price_per_gib_hour for price in current.storage_prices.all()}
            if current is not None
            else {}
        )
    if any(price < 0 for price in storage_prices.values()):
        raise ServiceError("Storage prices can't be negative.", field="prices")
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
    StoragePrice.objects.bulk_create(
        StoragePrice(version=version, region=region, price_per_gib_hour=price)
        for region, price in storage_prices.items()
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
            code=ErrorCode.CONFLICT,
        )
    audit_record(
        action="price_version.withdrawn",
        actor=user,
        target=version,
        request=request,
        metadata={"effective_from": version.effective_from.isoformat()},
    )
    version.delete()


# --- tenant pricing ----


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
