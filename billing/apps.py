from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate


class BillingConfig(AppConfig):
    """Billing builds on jobs: here it plugs its judgement into jobs' extension points
    (jobs never imports billing)."""

    name = "billing"
    verbose_name = "Billing"

    def ready(self) -> None:
        from billing import dbviews, panels, receivers
        from billing.job_costs import BillingJobCosts
        from billing.services import BudgetLaunchPolicy
        from jobs import extensions

        pre_migrate.connect(dbviews.drop_views, sender=self, dispatch_uid="billing-drop-views")
        post_migrate.connect(dbviews.create_views, sender=self, dispatch_uid="billing-create-views")
        extensions.launch_policy_register(BudgetLaunchPolicy())
        extensions.job_cost_provider_register(BillingJobCosts())
        panels.register()
        extensions.job_deleting.connect(
            receivers.job_deleting_keep_usage, dispatch_uid="billing-keep-deleted-job-usage"
        )
