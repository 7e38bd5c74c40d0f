from django.apps import AppConfig


class ServicesConfig(AppConfig):
    name = "services"
    verbose_name = "Services"

    def ready(self) -> None:
        # Django's one import in ready(): the receivers import models.
        from services import receivers

        receivers.connect()
