"""Talking to the API server: configuration, calls with timeouts, and errors sorted
into the two outcomes the services understand; parsing of quantities and pod status.

Every call carries `_request_timeout=settings.KUBERNETES_REQUEST_TIMEOUT`, and API errors
are sorted so:

- `BackendUnavailable` (retry later): 5xx, 429, timeouts, connection errors, 401, a 409
  conflict on update, a 404 namespace on create, a 403 over a ResourceQuota;
- `BackendRejected` (for good): other 4xx, such as 422 Invalid or 400, with the API's
  own message.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

from django.conf import settings
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from jobs.backends.base import BackendRejected, BackendUnavailable
from jobs.backends.kubernetes import manifests

log = logging.getLogger(__name__)

REGION_LABEL = "topology.kubernetes.io/region"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910")
GPU_PRODUCT_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name", "accelerator")
# Labels (key, value) that clouds and autoscalers put on spot/preemptible nodes.
SPOT_LABELS = {
    ("gpugeek.io/tier", "spot"),
    ("cloud.google.com/gke-spot", "true"),
    ("cloud.google.com/gke-preemptible", "true"),
    ("eks.amazonaws.com/capacityType", "SPOT"),
    ("karpenter.sh/capacity-type", "spot"),
    ("kubernetes.azure.com/scalesetpriority", "spot"),
    ("node.kubernetes.io/lifecycle", "spot"),
}
SPOT_TAINT_KEYS = {
    "gpugeek.io/spot",
    "cloud.google.com/gke-spot",
    "kubernetes.azure.com/scalesetpriority",
}
ACTIVE_POD_PHASES = {"Pending", "Running", "Unknown"}
# API groups the cluster serves, per API server, from discovery (KUEUE=auto, JobSet).
API_GROUPS_CACHE: dict[str, tuple[float, frozenset[str]]] = {}
API_GROUPS_TTL = 300.0
MERGE_PATCH = "application/merge-patch+json"  # custom resources take no strategic merge
# The collections `ApiCalls._create` posts to, by the typed client method that names them
# (the paths kubernetes.client's own methods use); the arguments before the body fill them.
CREATE_PATHS = {
    "create_namespace": "/api/v1/namespaces",
    "create_namespaced_secret": "/api/v1/namespaces/{}/secrets",
    "create_namespaced_config_map": "/api/v1/namespaces/{}/configmaps",
    "create_namespaced_service": "/api/v1/namespaces/{}/services",
    "create_namespaced_persistent_volume_claim": "/api/v1/namespaces/{}/persistentvolumeclaims",
    "create_namespaced_resource_quota": "/api/v1/namespaces/{}/resourcequotas",
    "create_namespaced_limit_range": "/api/v1/namespaces/{}/limitranges",
    "create_namespaced_network_policy": "/apis/networking.k8s.io/v1/namespaces/{}/networkpolicies",
    "create_namespaced_job": "/apis/batch/v1/namespaces/{}/jobs",
    "create_namespaced_deployment": "/apis/apps/v1/namespaces/{}/deployments",
    "create_namespaced_horizontal_pod_autoscaler": (
        "/apis/autoscaling/v2/namespaces/{}/horizontalpodautoscalers"
    ),
    "create_namespaced_custom_object": "/apis/{}/{}/namespaces/{}/{}",
    "create_priority_class": "/apis/scheduling.k8s.io/v1/priorityclasses",
    "create_cluster_custom_object": "/apis/{}/{}/{}",
}


def parse_millicores(quantity: str | None) -> int:
    """A CPU quantity ("500m", "2", "1.5") in millicores."""
    if not quantity:
        return 0
    if quantity.endswith("m"):
        return int(quantity[:-1])
    return int(float(quantity) * 1000)


def parse_cpu(quantity: str | None) -> int:
    """Whole vCPUs of a quantity, rounded down (for allocatable capacity)."""
    return parse_millicores(quantity) // 1000


def parse_memory_gib(quantity: str | None) -> int:
    if not quantity:
        return 0
    units = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "K": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor // 2**30)
    return int(quantity) // 2**30


def node_tier(labels: dict[str, str], taints: list) -> str:
    if labels.get("gpugeek.io/tier") in ("on_demand", "reserved"):
        return labels["gpugeek.io/tier"]
    if any((key, labels.get(key)) in SPOT_LABELS for key in labels):
        return "spot"
    if any(taint.key in SPOT_TAINT_KEYS for taint in taints or []):
        return "spot"
    return "on_demand"


# Container states that mean the image can never be pulled as given (the job fails);
# other pull errors (registry outage, rate limit) keep it pending while the kubelet retries.
FATAL_WAITING_REASONS = {"InvalidImageName", "ErrImageNeverPull"}
PULL_WAITING_REASONS = {"ErrImagePull", "ImagePullBackOff"}
FATAL_PULL_HINTS = ("not found", "manifest unknown", "unauthorized", "denied", "no such host")
TERMINATION_REASONS = {
    "OOMKilled": "out of memory (OOMKilled)",
    "ContainerCannotRun": "the container could not run",
    "StartError": "the container could not start",
}


def api_message(error: ApiException) -> str:
    """The `message` of the API's Status body, else the HTTP reason."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"{error.status or ''} {error.reason or ''}".strip() or "no response"


def classify(error: ApiException, what: str) -> Exception:
    """BackendUnavailable for what a retry can fix, BackendRejected for the rest."""
    status = error.status or 0
    message = api_message(error)
    retryable = (
        status == 0
        or status >= 500
        or status in (401, 404, 408, 409, 429)
        or (status == 403 and ("exceeded quota" in message or "being terminated" in message))
    )
    kind = BackendUnavailable if retryable else BackendRejected
    return kind(f"{what}: {message}")


def true_condition(obj: Any, kind: str) -> Any:
    """The True condition of `kind` on a Job or pod, or None."""
    for condition in (obj.status.conditions if obj.status else None) or []:
        if condition.type == kind and condition.status == "True":
            return condition
    return None


def kueue_owner_uid(kube_job: Any) -> str:
    """The uid Kueue's Workload is labelled with: the JobSet's for a JobSet's Job."""
    for owner in kube_job.metadata.owner_references or []:
        if owner.kind == "JobSet":
            return owner.uid
    return kube_job.metadata.uid


def job_finished(kube_job: Any) -> bool:
    return bool(true_condition(kube_job, "Complete") or true_condition(kube_job, "Failed"))


def main_container_status(pod: Any) -> Any:
    for status in (pod.status.container_statuses if pod.status else None) or []:
        if status.name == manifests.CONTAINER:
            return status
    return None


def pod_rank(pod: Any) -> int:
    """Global rank: the completion index plus the tier's rank offset."""
    annotations = pod.metadata.annotations or {}
    labels = pod.metadata.labels or {}
    index = annotations.get(manifests.COMPLETION_INDEX, labels.get(manifests.COMPLETION_INDEX))
    offset = annotations.get(manifests.RANK_OFFSET_ANNOTATION, "0")
    try:
        return int(index) + int(offset)
    except (TypeError, ValueError):
        return 0


def current_pods(pods: Iterable[Any]) -> dict[int, Any]:
    """The newest pod of each rank (a resumed Job replaces its ranks' pods)."""
    by_rank: dict[int, Any] = {}

    def created(pod: Any) -> tuple[str, str]:
        return (str(pod.metadata.creation_timestamp or ""), pod.metadata.name or "")

    for pod in sorted(pods, key=created):
        by_rank[pod_rank(pod)] = pod
    return dict(sorted(by_rank.items()))


def api_client_from_settings() -> client.ApiClient:
    """An API client for KUBECONFIG, or the in-cluster service account without it."""
    configuration = client.Configuration()
    try:
        if settings.KUBECONFIG:
            config.load_kube_config(
                config_file=settings.KUBECONFIG, client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as error:
        raise BackendUnavailable(f"Kubernetes is not configured: {error}") from error
    return client.ApiClient(configuration)


# One API client per process and configuration (see shared_api_client).
CLIENT_RELOAD_SECONDS = 60
_shared_client: dict[tuple, tuple[float, client.ApiClient]] = {}
_shared_client_lock = threading.Lock()


def _configuration_key() -> tuple:
    path = settings.KUBECONFIG
    if not path:
        return ("in-cluster",)
    try:
        stat = os.stat(path)
    except OSError:
        return (path, None)  # loading it will say what is wrong
    return (path, stat.st_mtime_ns, stat.st_size)


def shared_api_client() -> client.ApiClient:
    """The process's API client for the configured cluster, so every dispatch reuses one
    connection pool instead of reading the kubeconfig and connecting again (4 ms and a
    TCP handshake a launch). It is made again when the kubeconfig changes, and at least
    every CLIENT_RELOAD_SECONDS, so rotated or short-lived credentials take effect."""
    key = _configuration_key()
    with _shared_client_lock:
        kept = _shared_client.get(key)
        if kept is not None and time.monotonic() - kept[0] < CLIENT_RELOAD_SECONDS:
            return kept[1]
    made = api_client_from_settings()
    with _shared_client_lock:
        _shared_client.clear()  # an older configuration's client is left to its users
        _shared_client[key] = (time.monotonic(), made)
    return made


class ApiCalls:
    """The API groups' clients, and calls that sort errors into Backend* exceptions.

    Without an `api_client`, the configuration is loaded on first use, so building a
    backend never fails: a cluster that isn't configured is BackendUnavailable at the
    first call, where every caller already expects it."""

    def __init__(self, api_client: client.ApiClient | None = None):
        self._api_client = api_client

    @property
    def api_client(self) -> client.ApiClient:
        if self._api_client is None:
            self._api_client = shared_api_client()
        return self._api_client

    @functools.cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    @functools.cached_property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api_client)

    @functools.cached_property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api_client)

    @functools.cached_property
    def autoscaling(self) -> client.AutoscalingV2Api:
        return client.AutoscalingV2Api(self.api_client)

    @functools.cached_property
    def networking(self) -> client.NetworkingV1Api:
        return client.NetworkingV1Api(self.api_client)

    @functools.cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)

    @functools.cached_property
    def scheduling(self) -> client.SchedulingV1Api:
        return client.SchedulingV1Api(self.api_client)

    # --- plumbing ---------------------------------------------------------------------------
    def _call(
        self, what: str, fn: Callable[..., Any], *args: Any, ok: Iterable[int] = (), **kwargs
    ):
        """Call the API; statuses in `ok` return None, other errors become Backend*."""
        try:
            return fn(*args, _request_timeout=settings.KUBERNETES_REQUEST_TIMEOUT, **kwargs)
        except ApiException as error:
            if error.status in set(ok):
                return None
            raise classify(error, what) from error
        except (HTTPError, OSError) as error:
            raise BackendUnavailable(f"{what}: {error}") from error

    def _delete(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Delete; already gone is fine. The answer is not deserialised: depending on the
        kind and version the API returns the object or a Status, and the client's model
        for it would reject the other."""
        response = self._call(
            f"deleting {what}", fn, *args, ok=(404,), _preload_content=False, **kwargs
        )
        if response is not None:
            response.read()
            response.release_conn()

    def _create(self, what: str, fn: Callable[..., Any], *args: Any) -> bool:
        """Create; True when it was made now. An existing object of that name is success
        (False) when this installation made it, and BackendRejected when another console
        (or someone else) did: two consoles sharing a cluster never adopt each other's
        objects."""
        try:
            self._post(fn, *args)
        except ApiException as error:
            if error.status != 409:
                raise classify(error, f"creating {what}") from error
            self._check_owned(what, fn, *args)
            return False
        except (HTTPError, OSError) as error:
            raise BackendUnavailable(f"creating {what}: {error}") from error
        return True

    def _create_shared(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        """Create a cluster-scoped object every installation defines the same way (our
        PriorityClasses): one that exists already is success, whoever made it."""
        try:
            self._post(fn, *args)
        except ApiException as error:
            if error.status != 409:
                raise classify(error, f"creating {what}") from error
        except (HTTPError, OSError) as error:
            raise BackendUnavailable(f"creating {what}: {error}") from error

    def _post(self, create: Callable[..., Any], *args: Any) -> None:
        """`create(*args)` (a typed client method, e.g. BatchV1Api.create_namespaced_job)
        as one POST of the manifest through the same ApiClient: its configuration, token
        refresh, TLS and connection pool. The typed method would first validate the dict
        into the client's pydantic models and dump them back, and parse the answer into
        them again: half of a batch dispatch's CPU, for a manifest the API server
        validates anyway and an answer nobody reads. Raises ApiException as it would."""
        *scope, body = args
        path = CREATE_PATHS[create.__name__].format(*(quote(part, safe="") for part in scope))
        method, url, headers, _, _ = self.api_client.param_serialize(
            method="POST",
            resource_path=path,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(
            method, url, headers, body, _request_timeout=settings.KUBERNETES_REQUEST_TIMEOUT
        )
        response.read()
        response.response.release_conn()  # read to the end: the connection can be reused
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)

    def _namespace_is_ours(self, tenant_id: int) -> bool:
        """Whether the tenant's namespace exists and this installation made it. The console
        creates objects only in namespaces it owns (ensure_namespace refuses others), so
        a delete by name is safe exactly there: another console's namespace, or none,
        holds nothing of ours."""
        name = manifests.namespace_name(tenant_id)
        found = self._call(f"reading namespace {name}", self.core.read_namespace, name, ok=(404,))
        labels = ((found.metadata.labels if found.metadata else None) or {}) if found else {}
        ours = labels.get(manifests.INSTALLATION_LABEL) == manifests.installation_id()
        if found is not None and not ours:
            log.warning("namespace %s belongs to another installation: left alone", name)
        return ours

    def _check_owned(self, what: str, create: Callable[..., Any], *args: Any) -> None:
        """Read the object that `create(*args)` found existing and compare its installation
        label. The reader follows the client's naming: create_X(…, body) ↔ read_X(name, …),
        and for custom objects get_namespaced_custom_object(group, version, ns, plural, name)."""
        *scope, body = args
        name = body["metadata"]["name"]
        api = create.__self__  # type: ignore[attr-defined]
        if create.__name__ == "create_namespaced_custom_object":
            existing = self._call(f"reading {what}", api.get_namespaced_custom_object, *scope, name)
            labels = (existing.get("metadata") or {}).get("labels") or {}
        else:
            read = getattr(api, create.__name__.replace("create_", "read_", 1))
            existing = self._call(f"reading {what}", read, name, *scope)
            labels = (existing.metadata.labels if existing.metadata else None) or {}
        owner = labels.get(manifests.INSTALLATION_LABEL)
        if owner != manifests.installation_id():
            raise BackendRejected(
                f"{what} exists already but was not made by this console "
                f"(its {manifests.INSTALLATION_LABEL} label is {owner or 'missing'!r}, ours is "
                f"{manifests.installation_id()!r}); another installation may share this "
                "cluster, so it is left alone. Give each console its own "
                "GPUGEEK_INSTALLATION_ID and cluster, or remove the object."
            )
