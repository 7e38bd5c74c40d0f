from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from django.test import Client
from rest_framework.test import APIClient

from console import services
from console.models import Membership, Tenant, User
from console.permissions import Role
from tests.factories import DEFAULT_PASSWORD, MembershipFactory, TenantFactory, UserFactory


@dataclass
class TenantWorld:
    """A tenant with one user per role, for permission and isolation tests."""

    tenant: Tenant
    owner: User
    admin: User
    member: User
    viewer: User
    finance: User

    def membership(self, user: User) -> Membership:
        return Membership.objects.get(tenant=self.tenant, user=user)


def make_world(prefix: str) -> TenantWorld:
    tenant = TenantFactory(name=f"{prefix.title()} Corp", slug=prefix)
    users = {}
    for role in Role.values:
        user = UserFactory(email=f"{role}@{prefix}.test")
        MembershipFactory(tenant=tenant, user=user, role=role)
        users[role] = user
    return TenantWorld(tenant=tenant, **users)


@pytest.fixture
def world(db) -> TenantWorld:
    return make_world("acme")


@pytest.fixture
def other_world(db) -> TenantWorld:
    return make_world("globex")


@pytest.fixture
def password() -> str:
    return DEFAULT_PASSWORD


def signed_in_client(user: User, tenant: Tenant | None = None) -> Client:
    client = Client()
    client.force_login(user, backend="console.auth_backends.EmailBackend")
    if tenant is not None:
        session = client.session
        session["gpugeek_tenant_id"] = tenant.pk
        session.save()
    return client


@pytest.fixture
def owner_client(world) -> Client:
    return signed_in_client(world.owner, world.tenant)


def token_client(user: User, tenant: Tenant) -> APIClient:
    _, raw = services.api_token_create(user=user, tenant=tenant, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def owner_api(world) -> APIClient:
    return token_client(world.owner, world.tenant)


# Property tests: a bounded profile for CI (DESIGN.md: about 50 examples, no deadline).
from hypothesis import settings as hypothesis_settings  # noqa: E402

hypothesis_settings.register_profile("ci", max_examples=50, deadline=None)
hypothesis_settings.register_profile("dev", max_examples=100, deadline=None)
hypothesis_settings.load_profile("ci" if os.environ.get("CI") else "dev")

# The fake Kubernetes API server (real HTTP, official client) for backend tests.
from tests.fakes.kube_api import kube_api  # noqa: E402, F401
