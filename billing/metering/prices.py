"""Price lookup for a tick: which price version was in force at an instant, and what one
unit-hour of a job costs on a tier after its tenant's discount.

`PriceBook` loads every version once per tick (a small table) and prices each
(version, GPU type, region, tier, discount) once. A missing entry is a price-book gap:
the usage is recorded at zero with a note, and logged once per tick and price.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

from billing.metering.spans import JobRow
from billing.models import AMOUNT_QUANTUM
from marketplace.models import PriceVersion, TenantPricing
from marketplace.pricing import after_tenant_discount, unit_prices

log = logging.getLogger(__name__)
ZERO = Decimal(0)


class Price(NamedTuple):
    version_id: int | None
    currency: str
    unit_price: Decimal  # per unit-hour on this tier, after discount, quantized
    on_demand_price: Decimal  # per unit-hour on demand, after discount (not quantized)
    is_gap: bool  # no entry for this GPU type and region: recorded at zero, with a note


class PriceBook:
    """Every version, loaded once per tick, with each (version, GPU type, region, tier,
    discount) priced once."""

    def __init__(self) -> None:
        versions = list(
            PriceVersion.objects.prefetch_related("entries").order_by("effective_from", "pk")
        )
        self.versions = versions
        self.change_points = [v.effective_from for v in versions]
        self.entries = {
            (v.pk, e.gpu_type_id, e.region_id): e for v in versions for e in v.entries.all()
        }
        self.discounts = dict(TenantPricing.objects.values_list("tenant_id", "discount_percent"))
        self._prices: dict[tuple, Price] = {}

    def price(self, job: JobRow, tier: str, at: datetime) -> Price:
        """The price of one unit-hour of `job` on `tier` at `at` (the interval's start)."""
        index = bisect_right(self.change_points, at) - 1
        version = self.versions[index] if index >= 0 else None
        discount = self.discounts.get(job.tenant_id, ZERO)
        key = (version and version.pk, job.gpu_type_id, job.region_id, tier, discount)
        found = self._prices.get(key)
        if found is None:
            found = self._prices[key] = self._price(version, job, tier, discount, at)
        return found

    def _price(self, version, job: JobRow, tier: str, discount: Decimal, at) -> Price:
        entry = version and self.entries.get((version.pk, job.gpu_type_id, job.region_id))
        if entry is None:
            # Logged once per tick and price, not once per job: the alert staff act on.
            log.error(
                "price book gap: %s (e.g. job %s); usage recorded at zero",
                gap_note(job, at),
                job.pk,
            )
            currency = version.currency if version else "USD"
            return Price(version and version.pk, currency, ZERO, ZERO, True)
        prices = unit_prices(entry, version)
        return Price(
            version.pk,
            version.currency,
            after_tenant_discount(prices.for_tier(tier), discount).quantize(AMOUNT_QUANTUM),
            after_tenant_discount(prices.on_demand, discount),
            False,
        )


def gap_note(job: JobRow, at: datetime) -> str:
    what = job.gpu_type__slug or "CPU"
    return f"no price for {what} in {job.region__slug} at {at:%Y-%m-%d %H:%M}"
