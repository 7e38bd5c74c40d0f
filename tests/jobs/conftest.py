import pytest
from django.conf import settings

from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync


@pytest.fixture
def catalog(db):
    """The demo catalog plus this host's real local pools."""
    from jobs.backends.local import LocalBackend

    seed_catalog()
    capacity_sync(backend=LocalBackend())


@pytest.fixture(autouse=True)
def _no_log_follower_state_left():
    """Job ids repeat between tests on SQLite (a rolled-back transaction hands its ids out
    again): a log follower's lease or cursor left in Redis by an earlier test's job would
    make this test's follower wait for the lease to expire, or start at a stale line."""
    yield
    import redis

    from jobs.logstream import _redis_prefix

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        keys = list(client.scan_iter(f"{_redis_prefix()}:logfollow:*", count=1000))
        if keys:
            client.delete(*keys)
    except redis.RedisError:
        pass  # a test that stopped Redis on purpose
    finally:
        client.close()
