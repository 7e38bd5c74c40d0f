"""WebSocket routes of every app, collected in one list for asgi.py."""

from channels.generic.websocket import WebsocketConsumer
from django.urls import path, re_path

from environments.proxy import JupyterSocket
from jobs.consumers import JobConsumer, TenantConsumer
from services.consumers import ReplicaLogConsumer


class UnknownRouteConsumer(WebsocketConsumer):
    """Refuses sockets to unknown paths at the handshake (403) instead of a 500."""

    def connect(self):
        self.close()


websocket_urlpatterns: list = [
    path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi()),
    path("ws/tenant/", TenantConsumer.as_asgi()),
    path(
        "ws/services/<int:service_id>/replicas/<int:replica_id>/logs/",
        ReplicaLogConsumer.as_asgi(),
    ),
    # The kernels of an environment's Jupyter (environments.proxy).
    re_path(r"^env/(?P<tenant_slug>[-\w]+)/(?P<name>[-a-z0-9]+)/", JupyterSocket.as_asgi()),
    # Keep last: anything else is refused.
    re_path(r"", UnknownRouteConsumer.as_asgi()),
]
