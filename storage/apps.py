from django.apps import AppConfig


class StorageConfig(AppConfig):
    name = "storage"
    verbose_name = "Storage"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs.extensions import volume_provider_register
        from storage.volumes import StorageVolumeProvider

        volume_provider_register(StorageVolumeProvider())
