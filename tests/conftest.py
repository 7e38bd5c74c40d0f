from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from functools import cached_property

import pytest
from asgiref.sync import async_to_sync
from django.core.cache import cache
from django.test import Client
from redis.exceptions import RedisError
from rest_framework.test import APIClient

from console.models import Membership, Tenant, User
from console.permissions import Role
from console.services.tokens import api_token_create
from jobs.services.dispatch import SWEEP_QUEUED_KEY
from marketplace.demo import seed_catalog
from marketplace.inventory import NodeInventory
from marketplace.models import GpuType, PriceVersion, Region
from marketplace.services import capacity_sync
from tests.broker import broker_replaced
from tests.factories import DEFAULT_PASSWORD, MembershipFactory, TenantFactory, UserFactory

# The fake Kubernetes API server (real HTTP, official client) as the `kube_api` fixture.
pytest_plugins = ["tests.fakes.fixtures"]


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
    # Allowed on "This host" (the local backend) so tests can launch local jobs; tests of
    # that privilege make a tenant without it.
    tenant = TenantFactory(name=f"{prefix.title()} Corp", slug=prefix, may_run_on_host=True)
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


class SimulatedLocalHost:
    """The local backend's inventory on a fixed host: 16 vCPUs (4 cores, overcommitted
    4×), 64 GiB, no GPUs, whatever machine runs the tests. Named "local", so its pools
    are the ones jobs on the local backend land on."""

    name = "local"
    runs_on_console_host = True
    simulated = False
    VCPUS = 16

    def inventory(self) -> list[NodeInventory]:
        return [
            NodeInventory(
                name="testhost/cpu",
                region="local",
                tier="on_demand",
                vcpus_allocatable=self.VCPUS,
                memory_gib=64,
            )
        ]


class Catalog:
    """The seeded demo catalog, with lookups by slug."""

    @cached_property
    def version(self) -> PriceVersion:
        return PriceVersion.objects.get()

    def gpu(self, slug: str) -> GpuType:
        return GpuType.objects.get(slug=slug)

    def region(self, slug: str) -> Region:
        return Region.objects.get(slug=slug)


def catalog_seed() -> None:
    """The one test catalog: the demo catalog, with the local pools of a fixed simulated
    host (see above). Seeded per test by `catalog`, once per module by the marketplace
    tests' own fixture."""
    seed_catalog()
    capacity_sync(backend=SimulatedLocalHost())


@pytest.fixture
def catalog(db) -> Catalog:
    catalog_seed()
    return Catalog()


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
    _, raw = api_token_create(user=user, tenant=tenant, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def streamed_chunks(response) -> list[bytes]:
    """The pieces of a streaming response whose content is an async iterator (what an
    ASGI server sends at the client's pace), which the test client can't iterate."""

    async def collect() -> list[bytes]:
        return [chunk async for chunk in response.streaming_content]

    return async_to_sync(collect)()


@pytest.fixture(autouse=True)
def _nothing_cached_from_earlier_tests():
    """Each test starts with an empty cache (console.caching): rows rolled back after a
    test give their ids to the next test's rows, which must not find the old ones' keys.
    Only this session's keys (its own prefix: the Redis may be shared) are dropped."""
    try:
        client = cache._cache.get_client(write=True)  # type: ignore[attr-defined]
        keys = list(client.scan_iter(match=f"{cache.key_prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    except RedisError:
        pass  # no Redis for this test: nothing kept either


@pytest.fixture
def owner_api(world) -> APIClient:
    return token_client(world.owner, world.tenant)


# Property tests: a bounded profile for CI (DESIGN.md: about 50 examples, no deadline).
from hypothesis import settings as hypothesis_settings  # noqa: E402

hypothesis_settings.register_profile("ci", max_examples=50, deadline=None)
hypothesis_settings.register_profile("dev", max_examples=100, deadline=None)
hypothesis_settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def tasks_in_process(monkeypatch):
    """Tasks queued by console.queueing run in-process, as the worker would run them:
    only the broker is left out (a countdown runs at once)."""
    broker_replaced(monkeypatch, lambda task, args, countdown: task.apply(args=args, throw=True))


@pytest.fixture(autouse=True)
def _no_dispatch_sweep_mark_left():
    """A test that queued a sweep no worker took leaves its "queued" mark for a few
    seconds; the next test's admissions must queue their own."""
    yield
    with contextlib.suppress(Exception):
        cache.delete(SWEEP_QUEUED_KEY)
