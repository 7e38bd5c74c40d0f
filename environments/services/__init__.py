"""Writes for environments, one module per concern:

- `lifecycle`: create, change, start, stop, delete, and the status sync (the one place
  that sets an environment's status, from its current job's);
- `idle`: the idle rule applied (warn, stop, keep running; beat's pass) and the deletion
  of environments stopped longer than their policy allows;
- `keys`: keys added or removed while an environment runs, published to its sshd.

Callers import from here.
"""

from environments.services.idle import (
    environment_idle_check,
    environment_keep_alive,
    environment_ssh_activity,
    environments_delete_long_stopped,
    environments_sync_active,
)
from environments.services.keys import environment_keys_publish, environments_keys_refresh
from environments.services.lifecycle import (
    DEFAULT_HOME_GIB,
    IDLE_POLICY_DEFAULTS,
    KEEP_ALIVE_MAX_MINUTES,
    environment_connected,
    environment_create,
    environment_delete,
    environment_job_spec,
    environment_start,
    environment_stop,
    environment_sync,
    environment_update,
    idle_policy_validate,
    status_for_job,
)

__all__ = [
    "DEFAULT_HOME_GIB", "IDLE_POLICY_DEFAULTS", "KEEP_ALIVE_MAX_MINUTES", "environment_connected",
    "environment_create", "environment_delete", "environment_idle_check",
    "environment_job_spec", "environment_keep_alive", "environment_keys_publish",
    "environment_ssh_activity", "environment_start", "environment_stop", "environment_sync",
    "environment_update", "environments_delete_long_stopped", "environments_keys_refresh",
    "environments_sync_active", "idle_policy_validate", "status_for_job",
]  # fmt: skip
