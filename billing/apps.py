from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Billing builds on jobs: here it plugs its judgement into jobs' extension points
    (jobs never imports billing)."""

    name = "billing"
    verbose_name = "Billing"

    def ready(self) -> None:
        # Django's one import in ready(): the receivers import models, which can't load
        # while the app registry is being populated.
        from billing import receivers

        receivers.connect(self)
