from django.apps import AppConfig

from console.queueing import enqueue_on_commit


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from console.dashboard import dashboard_section_register
        from console.tenant_admin import tenant_reactivated, tenant_suspended
        from jobs.extensions import launch_policy_register
        from jobs.selectors import dashboard_jobs_context
        from jobs.services.launch import SuspensionLaunchPolicy
        from marketplace.signals import registry_credential_removed

        dashboard_section_register(dashboard_jobs_context)
        registry_credential_removed.connect(
            _remove_pull_secret_copies, dispatch_uid="jobs-remove-pull-secret-copies"
        )
        launch_policy_register(SuspensionLaunchPolicy())
        tenant_suspended.connect(_pause_suspended_tenant, dispatch_uid="jobs-suspension-pause")
        tenant_reactivated.connect(_readmit_reactivated, dispatch_uid="jobs-suspension-readmit")


def _remove_pull_secret_copies(sender, tenant_id: int, registry: str, **kwargs) -> None:
    enqueue_on_commit("jobs.tasks.registry_pull_secret_remove_task", tenant_id, registry)


def _pause_suspended_tenant(sender, tenant, reason: str, **kwargs) -> None:
    from jobs.services.actions import jobs_pause_for_suspension

    jobs_pause_for_suspension(tenant=tenant, reason=reason)


def _readmit_reactivated(sender, tenant, **kwargs) -> None:
    """Its queued jobs may take compute again; paused ones stay paused for their users."""
    from jobs.services.admission import jobs_admit

    jobs_admit()
