"""The one money format (`{% load money %}`): amounts with two decimals and their
currency, unit prices with four, rounded half up once; durations in words."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.template import Context, Template
from hypothesis import given
from hypothesis import strategies as st

from console.templatetags.money import format_money, money, unit_price
from console.templatetags.numbers import duration_text

D = Decimal


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (D("1342.5352553650000"), "USD", "1,342.54 USD"),
        (D("1799.906893229"), "EUR", "1,799.91 EUR"),
        (D("0.005"), "USD", "0.01 USD"),  # half up, not to even
        (D("0.004"), "USD", "0.00 USD"),
        (D("-0.001"), "USD", "0.00 USD"),  # never "-0.00"
        (D("-12.5"), "USD", "-12.50 USD"),
        (D(0), "USD", "0.00 USD"),
        ("8.81", "USD", "8.81 USD"),  # API strings too
        (7, "", "7.00"),
        (None, "USD", "—"),
        ("", "USD", "—"),
        ("not a number", "USD", "—"),
    ],
)
def test_money_has_two_decimals_and_its_currency(amount, currency, text):
    assert money(amount, currency) == text


@pytest.mark.parametrize(
    ("price", "text"),
    [
        (D("0.060443"), "0.0604 USD"),
        (D("1.79"), "1.7900 USD"),
        (D("0.80555"), "0.8056 USD"),
        (D("12345.6"), "12,345.6000 USD"),
    ],
)
def test_unit_prices_have_four_decimals(price, text):
    assert unit_price(price, "USD") == text


@given(st.decimals(min_value=-(10**9), max_value=10**9, allow_nan=False, places=9))
def test_money_is_the_amount_rounded_to_the_cent(amount):
    text = format_money(amount, "USD")
    number, currency = text.rsplit(" ", 1)
    assert currency == "USD"
    assert number.count(".") == 1 and len(number.split(".")[1]) == 2
    assert abs(D(number.replace(",", "")) - amount) <= D("0.005")


def test_the_filters_in_a_template():
    template = Template(
        "{% load money %}{{ amount|money:currency }} · {{ price|unit_price:currency }}"
    )
    html = template.render(
        Context({"amount": D("211.3632"), "price": D("0.8055"), "currency": "USD"})
    )
    assert html == "211.36 USD · 0.8055 USD"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "—"),
        (0, "0 s"),
        (45.9, "45 s"),
        (125, "2 min"),
        (3 * 3600 + 5 * 60, "3 h 05 min"),
        (2 * 86400 + 4 * 3600 + 59, "2 d 4 h"),
    ],
)
def test_durations_in_words(seconds, text):
    assert duration_text(seconds) == text
