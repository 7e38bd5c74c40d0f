from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from console import signals  # noqa: F401  (connects the sign-in audit receivers)
        from console.metrics import celery_signals_connect

        celery_signals_connect()
