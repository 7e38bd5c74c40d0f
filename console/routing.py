"""WebSocket routes of every app, collected in one list for asgi.py."""

from channels.generic.websocket import WebsocketConsumer
from django.urls import re_path


class UnknownRouteConsumer(WebsocketConsumer):
    """Refuses sockets to unknown paths at the handshake (403) instead of a 500."""

    def connect(self):
        self.close()


websocket_urlpatterns: list = [
    re_path(r"", UnknownRouteConsumer.as_asgi()),
]
