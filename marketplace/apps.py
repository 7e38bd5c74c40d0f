from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    verbose_name = "Marketplace"

    def ready(self) -> None:
        from marketplace.price_book_cache import connect_signals  # models are ready only now

        connect_signals()
