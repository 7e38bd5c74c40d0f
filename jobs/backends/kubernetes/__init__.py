"""The Kubernetes backend: `KubernetesBackend` (backend.py) is its one entry point.

Rooms: client.py (configuration, calls, errors, parsing), inventory.py (nodes),
namespaces.py (the tenant's namespace), kueue.py (Kueue and JobSet), pull_secrets.py
(registry logins), lifecycle.py (submit … release), observe.py (phase and reason),
podlogs.py (pod logs), watch.py (the watch on our Jobs and Pods), manifests/ (the
objects, as plain dicts).
"""

from jobs.backends.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
