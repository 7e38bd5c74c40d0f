"""Fixtures for the marketplace tests: the demo catalog and a platform staff user."""

from __future__ import annotations

from decimal import Decimal

import pytest

from console.models import User
from marketplace.models import (
    AllowedRegistry,
    GpuType,
    Image,
    NodePool,
    PriceVersion,
    Region,
)
from tests.conftest import Catalog, catalog_seed
from tests.factories import MembershipFactory, UserFactory


def _wipe_catalog() -> None:
    Image.objects.all().delete()
    AllowedRegistry.objects.all().delete()
    NodePool.objects.all().delete()
    PriceVersion.objects.all().delete()
    GpuType.objects.all().delete()
    Region.objects.all().delete()


@pytest.fixture(scope="module")
def _seeded_catalog(django_db_setup, django_db_blocker):
    """The shared test catalog (`tests.conftest.catalog_seed`), seeded once per module
    rather than per test (that doubles these tests' time), and removed afterwards, so no
    other test module sees it. Each test still runs in its own rolled-back transaction, so
    changes a test makes to the catalog don't leak."""
    with django_db_blocker.unblock():
        catalog_seed()
    yield
    with django_db_blocker.unblock():
        _wipe_catalog()


@pytest.fixture
def catalog(_seeded_catalog, db) -> Catalog:
    catalog = Catalog()
    # The figures in the tests rely on it.
    assert catalog.version.spot_discount_percent == Decimal(55)
    return catalog


@pytest.fixture
def staff_user(world) -> User:
    """Platform staff who is also a member of `world`, so it can hold an API token."""
    staff = UserFactory(email="staff@gpugeek.test", is_staff=True)
    MembershipFactory(tenant=world.tenant, user=staff, role="member")
    return staff
