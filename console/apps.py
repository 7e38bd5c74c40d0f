from django.apps import AppConfig

from console.metrics import celery_signals_connect


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from console import signals  # noqa: F401  (connects the sign-in audit receivers)

        celery_signals_connect()
