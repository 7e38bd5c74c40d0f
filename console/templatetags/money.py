"""The one money format of every page, the invoice PDF and e-mails.

`{% load money %}` then `{{ amount|money:currency }}` ("1,342.54 USD": two decimals,
rounded half up, thousands grouped, the currency always shown) and
`{{ price|unit_price:currency }}` for prices per GPU- or vCPU-hour (four decimals). Full
precision stays in the API and in CSV exports, which never go through these.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template

register = template.Library()

AMOUNT_PLACES = 2
UNIT_PRICE_PLACES = 4


def format_money(amount, currency: str = "", places: int = AMOUNT_PLACES) -> str:
    """`amount` with `places` decimals and its currency; "—" when there is no amount."""
    if amount is None or amount == "":
        return "—"
    try:
        number = amount if isinstance(amount, Decimal) else Decimal(str(amount))
        rounded = number.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    except (InvalidOperation, ValueError, TypeError):
        return "—"
    if rounded.is_zero():
        rounded = rounded.copy_abs()  # never "-0.00"
    text = f"{rounded:,.{places}f}"
    return f"{text} {currency}" if currency else text


@register.filter
def money(amount, currency: str = "") -> str:
    """An amount of money: two decimals and the currency."""
    return format_money(amount, currency or "")


@register.filter
def unit_price(amount, currency: str = "") -> str:
    """A price per unit (GPU-hour, vCPU-hour, GiB-hour): four decimals and the currency."""
    return format_money(amount, currency or "", UNIT_PRICE_PLACES)
