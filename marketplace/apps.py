from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    verbose_name = "Marketplace"

    def ready(self) -> None:
        # Django's one import in ready(): the receivers import models, which can't load
        # while the app registry is being populated.
        from marketplace import receivers

        receivers.connect()
