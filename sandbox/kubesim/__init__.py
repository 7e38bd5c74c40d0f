"""kubesim: a simulated Kubernetes cluster behind a real-HTTP Kubernetes API server.

No kube-apiserver can run on our machines, so the sandbox cluster and the tests talk
HTTP, through the official ``kubernetes`` client, to this server. It runs in-process on
``127.0.0.1:<port>`` in background threads and speaks the real API's paths, JSON bodies,
``Status`` errors, watch streams (newline-delimited JSON, 410 on expired
resourceVersions) and pod log streams, plus a fake controller (Job controller +
scheduler + kubelet) and fault injection.

Typical use (the ``kube_api`` fixture is registered for every test by
``pytest_plugins = ["tests.fakes.fixtures"]`` in tests/conftest.py; request it by name)::

    def test_something(kube_api, tmp_path):
        kube_api.add_node("gpu-1", labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
        core = kubernetes.client.CoreV1Api(kube_api.api_client())
        ...
        kube_api.tick()  # run the fake controllers now (they also run every 50 ms)

Real-cluster behaviour it reproduces on purpose (code under test must cope with it):

- Deleting a batch/v1 Job without ``propagationPolicy`` orphans its pods (with the real
  ``Warning`` header); pass ``propagation_policy="Background"`` (or Foreground).
- Job status omits zero counts (``active``/``succeeded``/``failed`` are None, not 0);
  list items carry no ``kind``/``apiVersion``; no-op updates keep the resourceVersion.
- Creating in a missing namespace is 404; a stale ``resourceVersion`` on PUT is 409;
  status written through the main resource is ignored (use the ``/status`` subresource).
- Logs of a container that has not started are a 400 ("waiting to start").
- A Deployment rolls out through ReplicaSets within maxSurge/maxUnavailable; a
  ReplicaSet's pods run real HTTP servers on loopback addresses (their podIP, see
  ``serving``) and are Ready only once their readinessProbe answers over HTTP (probed
  every periodSeconds); a Service's Endpoints list its ready pods; an HPA sets a
  Deployment's replicas from the pods' request-driven CPU or GPU use every
  ``hpa_sync_seconds`` (15; tests shorten it, and ``metrics_window_seconds``).
- Pod creation over a ResourceQuota is 403; a Job then records a ``FailedCreate`` event.
- urllib3 (under the client) retries idempotent requests on read timeouts/connection
  resets 3 times, and any 429/503 that carries ``Retry-After``: fault injection with
  ``times=1`` may be invisible to the caller for those.

Fidelity notes (differences from a real cluster) are listed in ``LIMITATIONS`` below.

Where things are: ``server`` (``KubeAPIServer``, lifecycle, client configuration) is
composed of ``api`` (routing, list/get/create/update/patch/delete, extra routes),
``discovery``, ``watch``, ``logs``, ``faults``, ``cluster`` (direct helpers such as
``add_node``, ``fail_pod``, ``evict_pod``, ``wait_for``), ``controllers`` (``jobs``,
``pods`` = scheduler + kubelet, ``serving`` = the kubelet's part for serving pods,
``deployments``, ``replicasets``, ``hpa``, ``endpoints``, ``kueue``, ``jobset``,
``quota``), ``serving`` (a serving pod's HTTP server and its addresses), ``kinds`` (per-kind
defaulting), ``admission`` (quotas, limit ranges) and ``store`` (objects, versions,
watch history); ``http``, ``errors``, ``resources``, ``selectors``, ``patches``,
``validation`` and ``conditions`` hold what they share. The package imports nothing of
Django or the console's apps.
"""

from __future__ import annotations

from sandbox.kubesim.api import RecordedRequest, RouteHandler
from sandbox.kubesim.controllers.jobs import JOB_INDEX_KEY
from sandbox.kubesim.controllers.pods import PodRun
from sandbox.kubesim.errors import ApiError, status_body
from sandbox.kubesim.patches import json_merge_patch, json_patch, strategic_merge_patch
from sandbox.kubesim.resources import (
    BUILTIN_TYPES,
    GPU_RESOURCES,
    ResourceType,
    format_quantity,
    parse_quantity,
)
from sandbox.kubesim.selectors import (
    Predicate,
    label_selector_from_dict,
    parse_field_selector,
    parse_label_selector,
)
from sandbox.kubesim.server import KubeAPIServer

__all__ = [
    "BUILTIN_TYPES",
    "GPU_RESOURCES",
    "JOB_INDEX_KEY",
    "LIMITATIONS",
    "ApiError",
    "KubeAPIServer",
    "PodRun",
    "Predicate",
    "RecordedRequest",
    "ResourceType",
    "RouteHandler",
    "format_quantity",
    "json_merge_patch",
    "json_patch",
    "label_selector_from_dict",
    "parse_field_selector",
    "parse_label_selector",
    "parse_quantity",
    "status_body",
    "strategic_merge_patch",
]


LIMITATIONS = """
- Deletion is immediate: no graceful termination, no Terminating namespaces, no finalizers.
- Strategic-merge patch is a JSON merge patch plus list merging by the usual merge keys
  (containers/env/volumes by name, volumeMounts by mountPath, ...); server-side apply
  (application/apply-patch+yaml) answers 415.
- fieldSelector accepts any dotted path (the real API allows only a few per resource).
- Pod spec immutability is not enforced; Job immutability is (selector, completionMode,
  completions, template except scheduling directives of a suspended, never-started Job).
- The Job controller recreates failed pods at once (no exponential back-off), ignores
  backoffLimitPerIndex/successPolicy, and treats FailIndex as Count; restartPolicy
  OnFailure containers are not restarted in place: fail_pod() always fails the pod.
- Evicted pods (evict_pod, the eviction subresource) stay as Failed pods with a
  DisruptionTarget condition instead of being deleted; PodDisruptionBudgets don't exist.
- The scheduler binds first-fit by node name on nodeSelector, required node affinity,
  taints/tolerations, readiness and allocatable resources; no preemption, no spreading.
- ResourceQuota: pods/requests.*/limits.*/cpu/memory/count/* keys, enforced on create only;
  LimitRange: only Container default/defaultRequest are applied.
- Watch: no bookmarks; without a resourceVersion (or "0") the current objects are sent
  as ADDED first. Watches without timeoutSeconds run until the client leaves or stop().
- Deployments: no ``paused``, no proportional scaling of a rollout in progress, a
  sha256-based pod-template-hash; ReplicaSets adopt no orphan pods; terminated pods of a
  ReplicaSet stay (no pod garbage collector). Readiness probes: httpGet only (no exec,
  tcpSocket or liveness/startup probes); a pod without a readinessProbe is Ready at start.
- Only ReplicaSets' pods serve HTTP (on 127.0.<1-254>.<1-254>, their podIP); a Service
  has no cluster IP that forwards: clients reach pods through their Endpoints.
- HPA: Deployment targets only; metrics are the serving pods' CPU (Resource cpu) and GPU
  utilisation (Resource nvidia.com/gpu, Pods/External gpu_utilization); no scaling
  policies (rate limits), only stabilisation windows; unready pods are left out of the
  average (counted as idle when scaling up), pods without metrics are ignored.
"""
