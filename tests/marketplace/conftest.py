"""Fixtures for the marketplace tests: the demo catalog and a platform staff user."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest

from console.models import User
from marketplace.demo import seed_catalog
from marketplace.models import (
    AllowedRegistry,
    GpuType,
    Image,
    NodePool,
    PriceVersion,
    Region,
)
from tests.factories import MembershipFactory, UserFactory


@dataclass
class Catalog:
    """The seeded demo catalog, with lookups by slug."""

    version: PriceVersion

    def gpu(self, slug: str) -> GpuType:
        return GpuType.objects.get(slug=slug)

    def region(self, slug: str) -> Region:
        return Region.objects.get(slug=slug)


def _wipe_catalog() -> None:
    Image.objects.all().delete()
    AllowedRegistry.objects.all().delete()
    NodePool.objects.all().delete()
    PriceVersion.objects.all().delete()
    GpuType.objects.all().delete()
    Region.objects.all().delete()


@pytest.fixture(scope="module")
def _seeded_catalog(django_db_setup, django_db_blocker):
    """Seed the demo catalog once per module (seeding takes a quarter of a second) and
    remove it afterwards, so no other test module sees it. Each test still runs in its
    own rolled-back transaction, so changes a test makes to the catalog don't leak."""
    with django_db_blocker.unblock():
        seed_catalog()
    yield
    with django_db_blocker.unblock():
        _wipe_catalog()


@pytest.fixture
def catalog(_seeded_catalog, db) -> Catalog:
    version = PriceVersion.objects.get()
    assert version.spot_discount_percent == Decimal(55)  # the figures in the tests rely on it
    return Catalog(version=version)


@pytest.fixture
def staff_user(world) -> User:
    """Platform staff who is also a member of `world`, so it can hold an API token."""
    staff = UserFactory(email="staff@gpugeek.test", is_staff=True)
    MembershipFactory(tenant=world.tenant, user=staff, role="member")
    return staff
