"""ASGI entry point: Django for HTTP (the services gateway in front of it for /svc/…),
Channels for WebSockets (routes added by the apps)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
# A web server reuses database connections from a pool (PostgreSQL; see settings).
os.environ.setdefault("DATABASE_POOL", "1")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.gc_tuning import tune_garbage_collector  # noqa: E402
from console.metrics import WebsocketMetrics  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402
from services.gateway import ServiceGateway  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ServiceGateway(django_asgi_app),
        "websocket": WebsocketMetrics(
            AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)

tune_garbage_collector()
