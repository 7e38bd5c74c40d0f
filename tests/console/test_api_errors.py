"""One error envelope for every refusal of the API ({"detail", "code", <field>: [...]}),
whatever refused it, and the schema documenting each operation's error answers."""

from __future__ import annotations

import re

import pytest
from django.test import Client, RequestFactory
from django.urls import reverse
from rest_framework.test import APIClient

from console import errors
from console.api.parsers import MAX_JSON_DEPTH
from console.api.schema import NOT_ONLY_WHITESPACE
from tests.conftest import token_client

pytestmark = pytest.mark.django_db


def envelope(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"], body
    assert body["code"] == code, body
    return body


def test_invalid_input_names_each_field_beside_detail_and_code(owner_api, catalog):
    body = envelope(owner_api.post("/api/v1/jobs", {"name": ""}, format="json"), 400, "invalid")
    assert body["name"] == ["This field may not be blank."]
    assert body["command"] == ["This field is required."]
    assert body["detail"] == "name: This field may not be blank."


def test_a_service_refusal_keeps_its_code_and_field(owner_api, world):
    owner = world.owner.email
    body = envelope(owner_api.post("/api/v1/invitations", {"email": owner}), 409, "conflict")
    assert body["email"] == [body["detail"]]


def test_credentials_permissions_and_methods_share_the_envelope(world):
    envelope(APIClient().get("/api/v1/jobs"), 401, "not_authenticated")
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer ggt_unknown")
    envelope(bad.get("/api/v1/jobs"), 401, "authentication_failed")
    viewer = token_client(world.viewer, world.tenant)
    invite = {"email": "new@acme.test"}
    envelope(viewer.post("/api/v1/invitations", invite, format="json"), 403, "permission_denied")
    envelope(viewer.delete("/api/v1/me"), 405, "method_not_allowed")
    envelope(viewer.get("/api/v1/jobs/999999"), 404, "not_found")
    envelope(viewer.get("/api/v1/no-such-thing"), 404, "not_found")
    # A staff endpoint stays hidden (404) from others, but a method it lacks is a 405.
    envelope(viewer.get("/api/v1/sandbox/nodes"), 404, "not_found")
    envelope(viewer.generic("TRACE", "/api/v1/sandbox/nodes"), 405, "method_not_allowed")


def test_a_wrong_password_and_a_server_error_share_it_too(world):
    body = {"email": world.owner.email, "password": "wrong"}
    envelope(Client().post("/api/v1/auth/token", body), 401, "authentication_failed")
    request = RequestFactory().get("/api/v1/jobs")
    response = errors.server_error(request)
    assert response.status_code == 500
    assert b'"code": "server_error"' in response.content


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/usage?gpu_type=a%00b",
        "/api/v1/offers?region=%00",
        "/api/v1/gpu-types/a%00b",
        "/api/v1/audit?action=%00",
    ],
)
def test_nul_in_an_api_url_is_refused_not_a_server_error(owner_api, url):
    envelope(owner_api.get(url), 400, "invalid")


@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000,  # the decoder itself gives up (RecursionError): was a 500
        "[" * 100_000 + "]" * 100_000,
        '{"name": ' + "[" * 5_000 + "]" * 5_000 + "}",
        "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),  # decodes, but too deep
    ],
    ids=["unclosed", "closed", "in-a-field", "one-level-too-deep"],
)
@pytest.mark.parametrize("url", ["/api/v1/jobs", "/api/v1/budgets", "/api/v1/auth/token"])
def test_a_too_deeply_nested_json_body_is_a_400_not_a_server_error(owner_api, catalog, url, body):
    response = owner_api.generic("POST", url, body, content_type="application/json")
    assert "levels" in envelope(response, 400, "parse_error")["detail"]


def test_json_nested_as_deep_as_allowed_reaches_the_view(owner_api, catalog):
    nested = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    body = '{"name": "deep", "image": "python-3.11", "command": ["x"], "ports": ' + nested + "}"
    response = owner_api.generic("POST", "/api/v1/jobs", body, content_type="application/json")
    assert "ports" in envelope(response, 400, "invalid")  # the serializer judged it


def test_nul_anywhere_in_a_json_body_is_refused_naming_the_field(owner_api, catalog):
    spec = {"name": "n", "image": "python-3.11", "command": ["x"], "ports": [{"n\x00": 1}]}
    body = envelope(owner_api.post("/api/v1/jobs", spec, format="json"), 400, "invalid")
    assert "ports" in body


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/v1/jobs?page_size=null", "page_size"),
        ("/api/v1/budgets?page_size=0", "page_size"),
        ("/api/v1/budgets?page=", "page"),
        ("/api/v1/offers?include_cpu=", "include_cpu"),
        ("/api/v1/offers?sort=cheapest", "sort"),
        ("/api/v1/jobs?status=done", "status"),
        ("/api/v1/usage?start=yesterday", "start"),
        ("/api/v1/audit?action=" + "x" * 101, "action"),
    ],
)
def test_query_parameters_are_checked_as_documented(owner_api, catalog, url, field):
    body = envelope(owner_api.get(url), 400, "invalid")
    assert field in body


def test_query_parameters_as_documented_are_accepted(owner_api, catalog):
    url = "/api/v1/offers?include_cpu=false&available=true&sort=availability&page_size=9999"
    assert owner_api.get(url).status_code == 200
    assert owner_api.get("/api/v1/usage?start=2026-11-01&end=2026-11-30").status_code == 200


def test_json_values_must_have_the_documented_type(owner_api, world):
    body = owner_api.post("/api/v1/tokens", {"name": 0}, format="json")
    assert "name" in envelope(body, 400, "invalid")
    secret = {"name": "HF_TOKEN", "value": "v", "members_may_use": 0}
    body = owner_api.post("/api/v1/secrets", secret, format="json")
    assert "members_may_use" in envelope(body, 400, "invalid")


def test_a_revoked_token_stays_readable_as_documented(owner_api, world):
    created = owner_api.post("/api/v1/tokens", {"name": "old"}, format="json").json()
    revoked = owner_api.delete(f"/api/v1/tokens/{created['id']}")
    assert revoked.status_code == 200 and revoked.json()["is_active"] is False
    again = owner_api.get(f"/api/v1/tokens/{created['id']}").json()
    assert again["is_active"] is False and again["revoked_at"]


@pytest.fixture
def schema(db) -> dict:
    return Client().get(reverse("api-schema"), {"format": "json"}).json()


def test_every_operation_documents_its_errors_in_the_envelope(schema):
    paths = schema["paths"]
    assert set(schema["components"]["schemas"]["Error"]["required"]) == {"detail", "code"}
    for path, item in paths.items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            codes = set(operation["responses"])
            if operation.get("security"):
                assert {"401", "403"} <= codes, (method, path)
            if "{" in path:
                assert "404" in codes, (method, path)
            if operation.get("requestBody"):
                assert "400" in codes, (method, path)
            for code in codes - {"200", "201", "202", "204"}:
                content = operation["responses"][code]["content"]["application/json"]
                assert content["schema"] == {"$ref": "#/components/schemas/Error"}, (path, code)
    assert "402" in paths["/api/v1/jobs/"]["post"]["responses"]
    assert {"401", "429"} <= set(paths["/api/v1/auth/token"]["post"]["responses"])
    assert "200" in paths["/api/v1/tokens/{id}/"]["delete"]["responses"]


def test_request_constraints_match_the_validators(schema):
    job = schema["components"]["schemas"]["JobCreateRequest"]["properties"]
    assert job["name"]["minLength"] == 1 and job["image"]["minLength"] == 1
    assert job["command"]["minItems"] == 1
    assert list(schema["paths"]["/api/v1/jobs/"]["post"]["requestBody"]["content"]) == [
        "application/json"
    ]
    links = schema["paths"]["/api/v1/jobs/"]["post"]["responses"]["201"]["links"]
    assert links["jobs_retrieve"]["parameters"] == {"id": "$response.body#/id"}
    assert {"jobs_pause_create", "jobs_destroy"} <= set(links)


def test_the_schema_s_non_blank_pattern_refuses_what_drf_trims_to_blank():
    # str.strip (DRF's trim) removes NEL and the separators U+001C-U+001F, which the
    # schema's regex dialect doesn't count as whitespace: the pattern names them.
    for blank in (" ", "\x85", " \x1c\x1f ", "\u3000", "\xa0\t"):
        assert blank.strip() == "" and not re.search(NOT_ONLY_WHITESPACE, blank)
    for text in ("a", " \ufeff", " x "):
        assert re.search(NOT_ONLY_WHITESPACE, text)
