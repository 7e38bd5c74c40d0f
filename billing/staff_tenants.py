"""Billing's part of the staff's organisation pages, through `console.staff_extensions`
(the console never imports billing): month-to-date spend, balance due and credit on the
organisations list, and a panel with the same figures and the billing settings (tax,
payment terms) on an organisation's page. Registered from `receivers.connect()`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal

from django.http import HttpRequest
from django.utils import timezone

from billing.finance.forms import BillingProfileForm
from billing.finance.selectors import TenantMoney, tenant_money
from billing.models import TenantBillingProfile
from console.models import Tenant
from console.staff_extensions import (
    StaffColumn,
    StaffColumns,
    StaffPanel,
    staff_columns_register,
    staff_panel_register,
)
from console.templatetags.money import format_money
from console.templatetags.numbers import decimals

COLUMNS = (
    StaffColumn("Spend this month", numeric=True),
    StaffColumn("Balance due", numeric=True),
    StaffColumn("Credit", numeric=True),
)


def money_text(amounts: Mapping[str, Decimal]) -> str:
    """Amounts per currency in the one money format ("1,234.50 USD"); "—" for none."""
    if not amounts:
        return "—"
    return ", ".join(format_money(amount, currency) for currency, amount in amounts.items())


def _cells(money: TenantMoney) -> list[str]:
    return [money_text(money.mtd_spend), money_text(money.balance_due), decimals(money.credit, 2)]


def money_cells(tenants: Sequence[Tenant]) -> dict[int, list[str]]:
    money = tenant_money(tenant_ids=[tenant.pk for tenant in tenants], now=timezone.now())
    return {tenant_id: _cells(figures) for tenant_id, figures in money.items()}


def profile_initial(tenant: Tenant) -> dict:
    """The tenant's billing settings as they are (the defaults if it has no profile yet;
    reading makes none)."""
    profile = TenantBillingProfile.objects.for_tenant(tenant).first() or TenantBillingProfile(
        tenant=tenant
    )
    return {
        "tax_rate_percent": profile.tax_rate_percent,
        "tax_label": profile.tax_label,
        "payment_terms_days": profile.payment_terms_days,
    }


def billing_panel_context(tenant: Tenant, form: BillingProfileForm | None = None) -> dict:
    money = tenant_money(tenant_ids=[tenant.pk], now=timezone.now())[tenant.pk]
    return {
        "tenant": tenant,
        "mtd_spend": money_text(money.mtd_spend),
        "balance_due": money_text(money.balance_due),
        "credit": decimals(money.credit, 2),
        "form": form or BillingProfileForm(initial=profile_initial(tenant)),
    }


def billing_panel(request: HttpRequest, tenant: Tenant) -> StaffPanel:
    return StaffPanel(
        template_name="billing/finance/_staff_tenant_panel.html",
        context=billing_panel_context(tenant),
    )


def register() -> None:
    staff_columns_register("billing.money", StaffColumns(columns=COLUMNS, cells=money_cells))
    staff_panel_register("billing.settings", billing_panel)
