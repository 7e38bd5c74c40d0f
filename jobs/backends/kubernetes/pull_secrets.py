"""Image pull Secrets: a tenant's stored registry login, copied into its namespace."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.client import (
    ApiCalls,
)
from marketplace.selectors import registry_login_for_image

if TYPE_CHECKING:
    from jobs.models import Job

log = logging.getLogger(__name__)


class PullSecretsMixin(ApiCalls):
    def ensure_pull_secret(self, job: Job, namespace: str) -> list[str]:
        """The image pull Secret for the job's registry, when the tenant stored a login for
        it: created, or replaced when it exists (409), so a changed password applies to
        the next launch. Returns the Secret names for `imagePullSecrets`."""
        login = registry_login_for_image(tenant=job.tenant_id, image_reference=job.image_reference)
        if login is None:
            return []
        secret = manifests.registry_secret_manifest(
            job.tenant_id, login.registry, login.username, login.password
        )
        name = secret["metadata"]["name"]
        created = self._create(
            f"image pull secret {name}", self.core.create_namespaced_secret, namespace, secret
        )
        if not created:
            self._call(
                f"updating image pull secret {name}",
                self.core.replace_namespaced_secret,
                name,
                namespace,
                secret,
            )
        return [name]

    def remove_pull_secret(self, tenant_id: int, registry: str) -> None:
        """Delete the tenant's image pull Secret for `registry` (its login was removed);
        jobs already running keep their pulled images."""
        if not self._namespace_is_ours(tenant_id):  # nothing of ours in another's namespace
            return
        name = manifests.registry_secret_name(registry)
        self._delete(
            f"image pull secret {name}",
            self.core.delete_namespaced_secret,
            name,
            manifests.namespace_name(tenant_id),
        )
