import pytest

from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync


@pytest.fixture
def catalog(db):
    """The demo catalog plus this host's real local pools."""
    from jobs.backends.local import LocalBackend

    seed_catalog()
    capacity_sync(backend=LocalBackend())
