"""Integration tests run real processes (uvicorn, a Celery worker, the launcher) against the
test database and a real Redis; the fixtures that start them live in tests/servers.py."""

from tests.servers import asgi_server, celery_worker_process  # noqa: F401
