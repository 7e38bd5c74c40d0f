from decimal import Decimal

import pytest
from django.template import Context, Template
from django.template.defaultfilters import floatformat

from console.templatetags.numbers import decimals


@pytest.mark.parametrize(
    ("value", "places", "expected"),
    [
        (Decimal("1.23456789"), 4, "1.2346"),
        (Decimal("2.5"), 0, "3"),  # half up, as floatformat rounds
        (Decimal("-0.00001"), 2, "0.00"),  # no negative zero
        (Decimal("1234567.891"), 2, "1234567.89"),  # no grouping
        (1.005, 2, "1.01"),  # a float goes through its shortest repr, like floatformat
        (3, 3, "3.000"),
        (None, 2, ""),
        ("", 2, ""),
        ("n/a", 2, ""),
    ],
)
def test_decimals_formats_like_floatformat_with_fixed_places(value, places, expected):
    assert decimals(value, places) == expected
    if expected and not isinstance(value, float):
        assert floatformat(value, places) == expected


def test_decimals_is_a_template_filter():
    rendered = Template("{% load numbers %}{{ v|decimals:3 }}").render(
        Context({"v": Decimal("0.1")})
    )
    assert rendered == "0.100"
