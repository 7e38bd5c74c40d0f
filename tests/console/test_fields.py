"""The project's strict text and boolean fields (console.api.fields): JSON values of the
documented type only, in our serializers, with DRF's own classes left as they are."""

from __future__ import annotations

import pytest
from django.http import QueryDict
from rest_framework import serializers

from console.api.fields import (
    FROM_QUERY_STRING,
    StrictBooleanField,
    StrictCharField,
    StrictEmailField,
    StrictModelSerializer,
)
from console.models import ApiToken
from jobs.api.serializers import JobCreateSerializer


class Strict(serializers.Serializer):
    name = StrictCharField(required=False)
    email = StrictEmailField(required=False)
    flag = StrictBooleanField(required=False)


def errors(data, **context) -> dict:
    serializer = Strict(data=data, context=context)
    assert not serializer.is_valid()
    return serializer.errors


@pytest.mark.parametrize("value", [0, 1.5, True, ["a"], {"a": "b"}])
def test_text_takes_only_a_string(value):
    assert errors({"name": value}) == {"name": ["Not a valid string."]}
    assert errors({"email": value}) == {"email": ["Enter a valid email address."]}


@pytest.mark.parametrize("value", [0, 1, "true", "yes", None])
def test_a_json_boolean_is_true_or_false(value):
    if value is None:
        assert errors({"flag": value}) == {"flag": ["This field may not be null."]}
    else:
        assert errors({"flag": value}) == {"flag": ["Must be a valid boolean."]}


def test_forms_and_query_strings_keep_drf_reading_of_booleans():
    form = Strict(data=QueryDict("flag=true&name=n"))
    assert form.is_valid(), form.errors
    assert form.validated_data == {"flag": True, "name": "n"}
    query = Strict(data={"flag": "false"}, context={FROM_QUERY_STRING: True})
    assert query.is_valid(), query.errors
    assert query.validated_data == {"flag": False}


def test_strings_and_booleans_of_the_right_type_pass():
    serializer = Strict(data={"name": " n ", "email": "a@b.example", "flag": False})
    assert serializer.is_valid(), serializer.errors
    assert serializer.validated_data == {"name": "n", "email": "a@b.example", "flag": False}


def test_drf_own_fields_are_left_as_they_are():
    class Plain(serializers.Serializer):
        name = serializers.CharField()
        flag = serializers.BooleanField()

    plain = Plain(data={"name": 0, "flag": 1})
    assert plain.is_valid(), plain.errors  # DRF's coercion: nothing of ours patched it
    assert plain.validated_data == {"name": "0", "flag": True}


def test_model_serializers_generate_strict_fields():
    class TokenSerializer(StrictModelSerializer):
        class Meta:
            model = ApiToken
            fields = ["name"]

    assert type(TokenSerializer().fields["name"]) is StrictCharField
    serializer = TokenSerializer(data={"name": 7})
    assert not serializer.is_valid()
    assert serializer.errors == {"name": ["Not a valid string."]}


def test_an_argument_is_a_string_with_its_own_message():
    spec = {"name": "n", "image": "python-3.11", "command": ["python", 3]}
    serializer = JobCreateSerializer(data=spec)
    assert not serializer.is_valid()
    assert serializer.errors["command"] == {1: ["Each argument is a string."]}
