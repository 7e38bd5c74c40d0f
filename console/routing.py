"""WebSocket routes of every app, collected in one list for asgi.py."""

websocket_urlpatterns: list = []
