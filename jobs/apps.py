from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        # Django's one import in ready(): the receivers import models, which can't load
        # while the app registry is being populated.
        from jobs import receivers

        receivers.connect()
