"""Fixtures for the marketplace tests: the demo catalog and a platform staff user."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest

from console.models import User
from marketplace.demo import seed_catalog
from marketplace.models import GpuType, PriceVersion, Region
from tests.factories import MembershipFactory, UserFactory


@dataclass
class Catalog:
    """The seeded demo catalog, with lookups by slug."""

    version: PriceVersion

    def gpu(self, slug: str) -> GpuType:
        return GpuType.objects.get(slug=slug)

    def region(self, slug: str) -> Region:
        return Region.objects.get(slug=slug)


@pytest.fixture
def catalog(db) -> Catalog:
    seed_catalog()
    version = PriceVersion.objects.get()
    assert version.spot_discount_percent == Decimal(55)  # the figures below rely on it
    return Catalog(version=version)


@pytest.fixture
def staff_user(world) -> User:
    """Platform staff who is also a member of `world`, so it can hold an API token."""
    staff = UserFactory(email="staff@gpugeek.test", is_staff=True)
    MembershipFactory(tenant=world.tenant, user=staff, role="member")
    return staff
