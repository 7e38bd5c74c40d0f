"""The SDK's hand-written models against the OpenAPI schema the server serves, so the
two can't drift: every model field is a property of its component and vice versa."""

from __future__ import annotations

import pytest
from gpugeek.models import SCHEMA_COMPONENTS

pytestmark = pytest.mark.integration


def test_models_match_the_served_openapi_schema(gg):
    schema = gg.http.get("schema/", format="json")
    components = schema["components"]["schemas"]
    checked = []
    for model, name in SCHEMA_COMPONENTS.items():
        assert name in components, f"{name} is missing from the schema"
        properties = set(components[name].get("properties", {}))
        fields = set(model.api_fields())
        assert fields == properties, (
            f"{model.__name__} vs schema {name}: "
            f"only in SDK {sorted(fields - properties)}, "
            f"only in schema {sorted(properties - fields)}"
        )
        checked.append(name)
    assert set(SCHEMA_COMPONENTS.values()) == set(checked)


def test_job_endpoints_the_sdk_calls_are_in_the_schema(gg):
    schema = gg.http.get("schema/", format="json")
    paths = schema["paths"]
    for path in (
        "/api/v1/jobs/",
        "/api/v1/jobs/{id}/",
        "/api/v1/jobs/{id}/logs/",
        "/api/v1/jobs/{id}/logs/stream",
        "/api/v1/jobs/{id}/pause/",
        "/api/v1/jobs/{id}/resume/",
        "/api/v1/jobs/{id}/cancel/",
        "/api/v1/offers/",
        "/api/v1/estimates",
        "/api/v1/gpu-types/",
        "/api/v1/pools/",
        "/api/v1/budgets/",
        "/api/v1/invoices/",
        "/api/v1/costs/summary",
    ):
        assert path in paths or path.rstrip("/") in paths, path
    create = paths.get("/api/v1/jobs/") or paths["/api/v1/jobs"]
    headers = {p["name"] for p in create["post"].get("parameters", []) if p["in"] == "header"}
    assert "Idempotency-Key" in headers
