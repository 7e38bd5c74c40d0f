"""A service's refusal: a closed set of codes, each with its HTTP status, and one way to
show it on a form."""

from __future__ import annotations

from http import HTTPStatus

import pytest
from django import forms
from rest_framework.test import APIRequestFactory

from console.api.errors import exception_handler
from console.forms import add_service_error
from console.service_errors import ErrorCode, ServiceError


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.INVALID, HTTPStatus.BAD_REQUEST),
        (ErrorCode.FORBIDDEN, HTTPStatus.FORBIDDEN),
        (ErrorCode.NOT_FOUND, HTTPStatus.NOT_FOUND),
        (ErrorCode.CONFLICT, HTTPStatus.CONFLICT),
        (ErrorCode.PAYMENT_REQUIRED, HTTPStatus.PAYMENT_REQUIRED),
    ],
)
def test_the_api_answers_each_code_with_its_status(code, status):
    request = APIRequestFactory().post("/api/v1/anything")
    error = ServiceError("No.", code=code, field="name")
    response = exception_handler(error, {"request": request})
    assert response.status_code == status
    assert response.data == {"name": ["No."], "detail": "No.", "code": str(code)}


def test_every_code_has_a_status():
    assert all(isinstance(code.http_status, HTTPStatus) for code in ErrorCode)


def test_a_code_outside_the_enum_is_refused_where_it_is_raised():
    with pytest.raises(ValueError):
        ServiceError("No.", code="teapot")  # type: ignore[arg-type]


class _NameForm(forms.Form):
    name = forms.CharField()


def test_a_refusal_naming_a_field_of_the_form_goes_beside_that_field():
    form = _NameForm({"name": "x"})
    assert form.is_valid()
    add_service_error(form, ServiceError("Taken.", code=ErrorCode.CONFLICT, field="name"))
    assert form.errors == {"name": ["Taken."]}


def test_a_refusal_naming_no_field_of_the_form_goes_above_it():
    form = _NameForm({"name": "x"})
    assert form.is_valid()
    add_service_error(form, ServiceError("Suspended.", field="slug"))
    assert form.non_field_errors() == ["Suspended."]
