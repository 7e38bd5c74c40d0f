"""Keys added or removed while an environment runs reach its sshd: the console publishes
the keys of everyone who may use it now to the running job (ComputeBackend.publish_file),
and sshd reads that file beside the keys it started with (environments.sshd). The SSH
gateway already decides on every connection; this lets a key added after the start in,
without a restart. Queued after a change of keys or memberships (environments.receivers)."""

from __future__ import annotations

import logging

from environments import jupyter, selectors, sshd
from environments.models import ACTIVE_STATUSES, Environment
from jobs.backends import get_backend
from jobs.models import FINISHED

logger = logging.getLogger(__name__)


def environment_keys_publish(*, environment: Environment) -> bool:
    """Publish the environment's current keys to its running job; False when it has no
    job that runs (or will), no SSH, or a backend that can't."""
    job = environment.current_job
    if job is None or job.status in FINISHED or not jupyter.has_ssh(environment):
        return False
    text = selectors.authorized_keys_text(environment=environment)
    return get_backend(job.backend).publish_file(job, sshd.PUBLISHED_KEYS, text)


def environments_keys_refresh(*, tenant_ids: list[int]) -> int:
    """Publish the keys of every active environment of these organisations (a key or a
    membership there changed); how many got them."""
    active = Environment.objects.filter(
        tenant_id__in=tenant_ids, status__in=ACTIVE_STATUSES
    ).select_related("tenant", "current_job")
    published = 0
    for environment in active:
        try:
            published += environment_keys_publish(environment=environment)
        except OSError:
            logger.exception("publishing the keys of environment %s failed", environment.pk)
    return published
