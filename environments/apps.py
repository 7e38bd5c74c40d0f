from django.apps import AppConfig


class EnvironmentsConfig(AppConfig):
    name = "environments"
    verbose_name = "Dev environments"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django's one import in ready(): the receivers import models.
        from environments import receivers

        receivers.connect(self)
