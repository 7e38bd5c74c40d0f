"""Where the marketplace plugs into the console: the price book cache follows price
changes, a new organisation gets the default quota of new organisations, and the
dashboard shows an organisation its limits. Connected once, from `MarketplaceConfig.ready()`."""

from __future__ import annotations

from console.dashboard import dashboard_section_register
from console.signals import tenant_created
from marketplace.price_book_cache import connect_signals
from marketplace.selectors import dashboard_limits_context
from marketplace.services import new_tenant_limits_apply


def _new_tenant_limits(sender, tenant, **kwargs) -> None:
    new_tenant_limits_apply(tenant=tenant)


def connect() -> None:
    connect_signals()
    tenant_created.connect(_new_tenant_limits, dispatch_uid="marketplace-new-tenant-limits")
    dashboard_section_register(dashboard_limits_context)
