import pytest
import redis
from django.conf import settings

from jobs.logs.leases import redis_prefix


@pytest.fixture(autouse=True)
def _no_log_follower_state_left():
    """Job ids repeat between tests on SQLite (a rolled-back transaction hands its ids out
    again): a log follower's lease or cursor left in Redis by an earlier test's job would
    make this test's follower wait for the lease to expire, or start at a stale line."""
    yield
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        keys = list(client.scan_iter(f"{redis_prefix()}:logfollow:*", count=1000))
        if keys:
            client.delete(*keys)
    except redis.RedisError:
        pass  # a test that stopped Redis on purpose
    finally:
        client.close()
