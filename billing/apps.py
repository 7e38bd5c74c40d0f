from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = "Billing"

    def ready(self) -> None:
        from billing import dbviews

        pre_migrate.connect(dbviews.drop_views, sender=self, dispatch_uid="billing-drop-views")
        post_migrate.connect(dbviews.create_views, sender=self, dispatch_uid="billing-create-views")
