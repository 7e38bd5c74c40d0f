from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from console import signals  # noqa: F401  (connects the sign-in audit receivers)
        from console.api.fields import json_types_as_documented
        from console.celery import app as celery_app
        from console.metrics import celery_signals_connect
        from console.worker import worker_heartbeat_install

        celery_signals_connect()
        worker_heartbeat_install(celery_app)
        json_types_as_documented()
