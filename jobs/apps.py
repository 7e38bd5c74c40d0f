from django.apps import AppConfig

from console.queueing import enqueue_on_commit


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from console.dashboard import dashboard_section_register
        from jobs.selectors import dashboard_jobs_context
        from marketplace.signals import registry_credential_removed

        dashboard_section_register(dashboard_jobs_context)
        registry_credential_removed.connect(
            _remove_pull_secret_copies, dispatch_uid="jobs-remove-pull-secret-copies"
        )


def _remove_pull_secret_copies(sender, tenant_id: int, registry: str, **kwargs) -> None:
    enqueue_on_commit("jobs.tasks.registry_pull_secret_remove_task", tenant_id, registry)
