"""The Kubernetes backend, through the official client (KUBECONFIG or in-cluster).

A job's attempt runs as one Indexed `batch/v1` Job per tier (on-demand, spot) in the
tenant's namespace; the objects are built in `kubernetes_manifests`. Every call carries
`_request_timeout=settings.KUBERNETES_REQUEST_TIMEOUT`, and API errors are sorted into
the two outcomes the services understand:

- `BackendUnavailable` (retry later): 5xx, 429, timeouts, connection errors, 401, a 409
  conflict on update, a 404 namespace on create, a 403 over a ResourceQuota;
- `BackendRejected` (for good): other 4xx, such as 422 Invalid or 400, with the API's
  own message.

Every write is idempotent: names are deterministic, 409 AlreadyExists on create and 404
on delete/patch mean "done already", so a task that runs twice has one effect.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from jobs.backends import kubernetes_manifests as manifests
from jobs.backends.base import (
    BackendRejected,
    BackendUnavailable,
    LogLine,
    LogSource,
    NodeInventory,
    Observation,
)

if TYPE_CHECKING:
    from jobs.models import Job

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
_API_GROUPS: dict[str, tuple[float, frozenset[str]]] = {}
API_GROUPS_TTL = 300.0
MERGE_PATCH = "application/merge-patch+json"  # custom resources take no strategic merge


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


def _condition(obj: Any, kind: str) -> Any:
    """The True condition of `kind` on a Job or pod, or None."""
    for condition in (obj.status.conditions if obj.status else None) or []:
        if condition.type == kind and condition.status == "True":
            return condition
    return None


def _kueue_owner_uid(kube_job: Any) -> str:
    """The uid Kueue's Workload is labelled with: the JobSet's for a JobSet's Job."""
    for owner in kube_job.metadata.owner_references or []:
        if owner.kind == "JobSet":
            return owner.uid
    return kube_job.metadata.uid


def _is_finished(kube_job: Any) -> bool:
    return bool(_condition(kube_job, "Complete") or _condition(kube_job, "Failed"))


def _main_status(pod: Any) -> Any:
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


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, api_client: client.ApiClient):
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def from_settings(cls) -> KubernetesBackend:
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
        return cls(client.ApiClient(configuration))

    def inventory(self) -> list[NodeInventory]:
        timeout = settings.KUBERNETES_REQUEST_TIMEOUT
        try:
            nodes = self.core.list_node(_request_timeout=timeout).items
            pods = self.core.list_pod_for_all_namespaces(_request_timeout=timeout).items
        except (ApiException, HTTPError, OSError) as error:
            raise BackendUnavailable(f"listing nodes failed: {error}") from error

        gpus_used: dict[str, int] = {}
        millicores_used: dict[str, int] = {}
        for pod in pods:
            node_name = pod.spec.node_name if pod.spec else None
            if not node_name or (pod.status and pod.status.phase not in ACTIVE_POD_PHASES):
                continue
            for container in pod.spec.containers or []:
                requests = (container.resources.requests or {}) if container.resources else {}
                limits = (container.resources.limits or {}) if container.resources else {}
                for resource in GPU_RESOURCES:
                    amount = limits.get(resource) or requests.get(resource)
                    if amount:
                        gpus_used[node_name] = gpus_used.get(node_name, 0) + int(amount)
                # Summed in millicores: each small request must count (4 × 500m = 2).
                millicores_used[node_name] = millicores_used.get(node_name, 0) + parse_millicores(
                    requests.get("cpu")
                )

        inventory = []
        for node in nodes:
            labels = node.metadata.labels or {}
            allocatable = (node.status.allocatable or {}) if node.status else {}
            resource = next((r for r in GPU_RESOURCES if int(allocatable.get(r, 0) or 0)), None)
            product = next((labels[k] for k in GPU_PRODUCT_LABELS if k in labels), None)
            name = node.metadata.name
            inventory.append(
                NodeInventory(
                    name=name,
                    region=labels.get(REGION_LABEL, ""),
                    tier=node_tier(labels, node.spec.taints if node.spec else []),
                    labels=labels,
                    gpu_resource=resource,
                    gpu_product=product if resource else None,
                    gpus_allocatable=int(allocatable.get(resource, 0)) if resource else 0,
                    gpus_in_use=gpus_used.get(name, 0),
                    vcpus_allocatable=parse_cpu(allocatable.get("cpu")),
                    # Rounded up: a vCPU partly taken is not free.
                    vcpus_in_use=-(-millicores_used.get(name, 0) // 1000),
                    memory_gib=parse_memory_gib(allocatable.get("memory")),
                    schedulable=not (node.spec and node.spec.unschedulable),
                )
            )
        return inventory

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

    def _create(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Create; an existing object of that name is success (None)."""
        return self._call(f"creating {what}", fn, *args, ok=(409,))

    # --- lifecycle ----------------------------------------------------------------------------
    def ensure_namespace(self, tenant_id: int) -> str:
        """The tenant's namespace with its quota, limits and network policy (idempotent;
        the quota follows the tenant's current TenantQuota rows)."""
        from marketplace.models import GpuType, TenantQuota

        quotas = list(TenantQuota.objects.filter(tenant_id=tenant_id))
        gpu_resources: dict[str, list[int]] = {}
        for gpu_type_id, resource in GpuType.objects.filter(is_active=True).values_list(
            "pk", "resource_name"
        ):
            gpu_resources.setdefault(resource, []).append(gpu_type_id)
        namespace, quota, limit_range, network_policy = manifests.namespace_manifests(
            tenant_id, quotas, gpu_resources
        )
        name = namespace["metadata"]["name"]
        self._create(f"namespace {name}", self.core.create_namespace, namespace)
        if (
            self._create(
                f"resource quota in {name}", self.core.create_namespaced_resource_quota, name, quota
            )
            is None
        ):
            self._call(
                f"updating the resource quota in {name}",
                self.core.patch_namespaced_resource_quota,
                quota["metadata"]["name"],
                name,
                [{"op": "add", "path": "/spec/hard", "value": quota["spec"]["hard"]}],
            )
        self._create(
            f"limit range in {name}", self.core.create_namespaced_limit_range, name, limit_range
        )
        self._create(
            f"network policy in {name}",
            self.networking.create_namespaced_network_policy,
            name,
            network_policy,
        )
        queue = self.kueue_queue()
        if queue:
            local_queue = manifests.local_queue_manifest(
                tenant_id, queue, settings.KUEUE_CLUSTER_QUEUE
            )
            self._create(
                f"Kueue LocalQueue in {name}",
                self.custom.create_namespaced_custom_object,
                manifests.KUEUE_GROUP,
                manifests.KUEUE_VERSION,
                name,
                "localqueues",
                local_queue,
            )
        return name

    # --- Kueue ----------------------------------------------------------------------------
    def api_groups(self) -> frozenset[str]:
        """The API groups this cluster serves (discovery, cached for a few minutes)."""
        host = self.api_client.configuration.host
        cached = _API_GROUPS.get(host)
        if cached is not None and time.monotonic() - cached[0] < API_GROUPS_TTL:
            return cached[1]
        discovery = client.ApisApi(self.api_client)
        listed = self._call("discovering API groups", discovery.get_api_versions)
        groups = frozenset(group.name for group in listed.groups or [])
        _API_GROUPS[host] = (time.monotonic(), groups)
        return groups

    def kueue_queue(self) -> str | None:
        """The tenant LocalQueue's name when Kueue admits our jobs (KUEUE=on, or auto and
        the cluster serves kueue.x-k8s.io), else None: then our admission alone decides."""
        mode = settings.KUEUE
        if mode == "off" or (mode == "auto" and manifests.KUEUE_GROUP not in self.api_groups()):
            return None
        return settings.KUEUE_QUEUE_NAME

    def _gang(self, job: Job, queue: str | None) -> bool:
        """A split job goes to Kueue as one JobSet (manifests.jobset_manifest says why),
        where the cluster has JobSet; without it, as one Job per tier (each admitted on
        its own, so a warning)."""
        if not manifests.is_gang(job, queue):
            return False
        if manifests.JOBSET_GROUP in self.api_groups():
            return True
        log.warning("job %s: JobSet isn't installed; Kueue admits its tiers apart", job.pk)
        return False

    def _workloads(self, namespace: str, owner_uid: str) -> list[dict]:
        """Kueue's Workload(s) of a Job or JobSet (labelled with its uid)."""
        listed = self._call(
            "listing Kueue workloads",
            self.custom.list_namespaced_custom_object,
            manifests.KUEUE_GROUP,
            manifests.KUEUE_VERSION,
            namespace,
            "workloads",
            label_selector=f"kueue.x-k8s.io/job-uid={owner_uid}",
            ok=(404,),
        )
        return (listed or {}).get("items") or []

    def _set_workloads_active(self, job: Job, kube_jobs: list[Any], active: bool) -> bool:
        """Deactivate (pause) or reactivate (resume) the attempt's Workloads: the way to
        stop a Kueue-managed job, since Kueue owns `suspend`. Returns False when Kueue
        hasn't made a Workload yet."""
        namespace = manifests.namespace_name(job.tenant_id)
        found = False
        for owner_uid in sorted({_kueue_owner_uid(kube_job) for kube_job in kube_jobs}):
            for workload in self._workloads(namespace, owner_uid):
                found = True
                self._call(
                    f"updating Kueue workload {workload['metadata']['name']}",
                    self.custom.patch_namespaced_custom_object,
                    manifests.KUEUE_GROUP,
                    manifests.KUEUE_VERSION,
                    namespace,
                    "workloads",
                    workload["metadata"]["name"],
                    {"spec": {"active": active}},
                    _content_type=MERGE_PATCH,
                    ok=(404,),
                )
        return found

    def _kueue_wait_reason(self, job: Job, kube_jobs: list[Any]) -> str:
        """Why Kueue hasn't admitted the attempt yet, from its Workload's conditions."""
        namespace = manifests.namespace_name(job.tenant_id)
        for owner_uid in sorted({_kueue_owner_uid(kube_job) for kube_job in kube_jobs}):
            for workload in self._workloads(namespace, owner_uid):
                for condition in (workload.get("status") or {}).get("conditions") or []:
                    if condition.get("type") == "QuotaReserved" and condition.get("message"):
                        return f"waiting for Kueue admission: {condition['message']}"[:500]
        return "waiting for Kueue admission"

    def ensure_pull_secret(self, job: Job, namespace: str) -> list[str]:
        """The image pull Secret for the job's registry, when the tenant stored a login for
        it: created, or replaced when it exists (409), so a changed password applies to
        the next launch. Returns the Secret names for `imagePullSecrets`."""
        from marketplace.selectors import registry_login_for_image

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
        if created is None:
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
        name = manifests.registry_secret_name(registry)
        self._delete(
            f"image pull secret {name}",
            self.core.delete_namespaced_secret,
            name,
            manifests.namespace_name(tenant_id),
        )

    def _create_attempt(self, job: Job, *, resumed: bool) -> None:
        from console.crypto import decrypt_json

        namespace = self.ensure_namespace(job.tenant_id)
        if job.secret_env_names:
            values = decrypt_json(job.secret_env_encrypted) or {}
            secret = manifests.secret_manifest(job, values)
            self._create(
                f"secret {secret['metadata']['name']}",
                self.core.create_namespaced_secret,
                namespace,
                secret,
            )
        service = manifests.service_manifest(job)
        self._create(
            f"service {service['metadata']['name']}",
            self.core.create_namespaced_service,
            namespace,
            service,
        )
        pull_secrets = self.ensure_pull_secret(job, namespace)
        queue = self.kueue_queue()
        if self._gang(job, queue):
            jobset = manifests.jobset_manifest(
                job, kueue_queue=queue, resumed=resumed, pull_secrets=pull_secrets
            )
            self._create(
                f"JobSet {jobset['metadata']['name']}",
                self.custom.create_namespaced_custom_object,
                manifests.JOBSET_GROUP,
                manifests.JOBSET_VERSION,
                namespace,
                "jobsets",
                jobset,
            )
            return
        for manifest in manifests.job_manifests(
            job, resumed=resumed, pull_secrets=pull_secrets, kueue_queue=queue
        ):
            self._create(
                f"Job {manifest['metadata']['name']}",
                self.batch.create_namespaced_job,
                namespace,
                manifest,
            )

    def _jobs_of(self, job: Job) -> list[Any]:
        """Every Kubernetes Job of this job, all attempts and tiers."""
        namespace = manifests.namespace_name(job.tenant_id)
        listed = self._call(
            f"listing the Jobs of job {job.pk}",
            self.batch.list_namespaced_job,
            namespace,
            label_selector=f"{manifests.JOB_LABEL}={job.pk}",
            ok=(404,),
        )
        return listed.items if listed is not None else []

    def _delete_job(self, namespace: str, name: str) -> None:
        # Background propagation: batch/v1's default would orphan the pods.
        self._delete(
            f"Job {name}",
            self.batch.delete_namespaced_job,
            name,
            namespace,
            propagation_policy="Background",
        )

    def submit(self, job: Job) -> None:
        """Create the attempt's objects; earlier attempts' Jobs are removed first, so a
        requeued job never holds two attempts' compute."""
        namespace = manifests.namespace_name(job.tenant_id)
        if job.attempt > 1:
            if self.kueue_queue():  # a JobSet first, or it would make its Jobs again
                for attempt in range(1, job.attempt):
                    self._delete_jobset(namespace, f"gg-{job.pk}-a{attempt}")
            for kube_job in self._jobs_of(job):
                labels = kube_job.metadata.labels or {}
                if labels.get(manifests.ATTEMPT_LABEL) != str(job.attempt):
                    self._delete_job(namespace, kube_job.metadata.name)
        self._create_attempt(job, resumed=False)

    def _delete_jobset(self, namespace: str, name: str) -> None:
        self._delete(
            f"JobSet {name}",
            self.custom.delete_namespaced_custom_object,
            manifests.JOBSET_GROUP,
            manifests.JOBSET_VERSION,
            namespace,
            "jobsets",
            name,
            propagation_policy="Background",
        )

    def _attempt_jobs(self, job: Job) -> dict[str, Any]:
        """The current attempt's Kubernetes Jobs by tier, found by label: the same for
        our own Jobs and for those a JobSet made (which carry the template's labels)."""
        namespace = manifests.namespace_name(job.tenant_id)
        listed = self._call(
            f"listing the Jobs of job {job.pk}",
            self.batch.list_namespaced_job,
            namespace,
            label_selector=(
                f"{manifests.JOB_LABEL}={job.pk},{manifests.ATTEMPT_LABEL}={job.attempt}"
            ),
            ok=(404,),
        )
        by_tier: dict[str, Any] = {}
        for kube_job in listed.items if listed is not None else []:
            tier = (kube_job.metadata.labels or {}).get(manifests.TIER_LABEL)
            if tier:
                by_tier[tier] = kube_job
        return by_tier

    def _jobset_exists(self, job: Job) -> bool:
        if not self.kueue_queue() or len(manifests.tiers(job)) < 2:
            return False
        return (
            self._call(
                f"reading JobSet {manifests.jobset_name(job)}",
                self.custom.get_namespaced_custom_object,
                manifests.JOBSET_GROUP,
                manifests.JOBSET_VERSION,
                manifests.namespace_name(job.tenant_id),
                "jobsets",
                manifests.jobset_name(job),
                ok=(404,),
            )
            is not None
        )

    @staticmethod
    def _kueue_managed(kube_jobs: Iterable[Any]) -> bool:
        return any(
            manifests.KUEUE_QUEUE_LABEL in (kube_job.metadata.labels or {})
            or _kueue_owner_uid(kube_job) != kube_job.metadata.uid
            for kube_job in kube_jobs
        )

    def _patch_tiers(self, job: Job, body: dict) -> list[str]:
        """Patch each tier Job of the attempt; returns the names that were missing."""
        namespace = manifests.namespace_name(job.tenant_id)
        missing = []
        for tier, _, _ in manifests.tiers(job):
            name = manifests.job_name(job, tier)
            patched = self._call(
                f"updating Job {name}",
                self.batch.patch_namespaced_job,
                name,
                namespace,
                body,
                ok=(404,),
            )
            if patched is None:
                missing.append(name)
        return missing

    def suspend(self, job: Job) -> None:
        """`spec.suspend: true`: the Job controller deletes the pods (SIGTERM, then the
        grace period) and keeps the Job and its completed indexes. Under Kueue, which
        owns `suspend`, the Workload is deactivated instead: Kueue then suspends the Job
        (or JobSet) the same way and releases its quota."""
        kube_jobs = list(self._attempt_jobs(job).values())
        if self._kueue_managed(kube_jobs) and self._set_workloads_active(job, kube_jobs, False):
            return
        self._patch_tiers(job, {"spec": {"suspend": True}})

    def resume(self, job: Job) -> None:
        """Unsuspend the same Jobs and set the `gpugeek.io/resumed` pod annotation that
        GPUGEEK_RESUMED reads, in one patch.

        Why not delete and recreate (or `-r<n>` names)? A suspended Job that has not
        restarted accepts changes to its pod template's labels and annotations (the
        Job controller clears `status.startTime` on suspend), so one patch keeps the
        name, the rendezvous address and the completed indexes, and can't race a
        deletion still in progress. A Job that is gone (deleted by hand) is created
        again with GPUGEEK_RESUMED=1.
        """
        kube_jobs = self._attempt_jobs(job)
        if kube_jobs and self._kueue_managed(kube_jobs.values()):
            self._resume_under_kueue(job, kube_jobs)
            return
        body = {
            "spec": {
                "suspend": False,
                "template": {"metadata": {"annotations": {manifests.RESUMED_ANNOTATION: "1"}}},
            }
        }
        try:
            missing = self._patch_tiers(job, body)
        except BackendRejected as error:
            # The template was refused (an older cluster): resume without the flag;
            # the checkpoint itself still tells the program where to continue.
            log.warning("job %s: resuming without GPUGEEK_RESUMED=1 (%s)", job.pk, error)
            missing = self._patch_tiers(job, {"spec": {"suspend": False}})
        if missing:
            self._create_attempt(job, resumed=True)

    def _resume_under_kueue(self, job: Job, kube_jobs: dict[str, Any]) -> None:
        """Flag the pods as resumed (allowed while suspended), then reactivate the
        Workload so that Kueue admits the attempt again and unsuspends it."""
        namespace = manifests.namespace_name(job.tenant_id)
        flag = {manifests.RESUMED_ANNOTATION: "1"}
        if any(_kueue_owner_uid(k) != k.metadata.uid for k in kube_jobs.values()):
            # A JobSet copies its template to its Jobs when it is unsuspended.
            ops = [
                {
                    "op": "replace",
                    "path": f"/spec/replicatedJobs/{index}/template/spec/template/metadata"
                    f"/annotations/{manifests.RESUMED_ANNOTATION.replace('/', '~1')}",
                    "value": "1",
                }
                for index in range(len(manifests.tiers(job)))
            ]
            self._call(
                f"updating JobSet {manifests.jobset_name(job)}",
                self.custom.patch_namespaced_custom_object,
                manifests.JOBSET_GROUP,
                manifests.JOBSET_VERSION,
                namespace,
                "jobsets",
                manifests.jobset_name(job),
                ops,
                _content_type="application/json-patch+json",
            )
        else:
            self._patch_tiers(job, {"spec": {"template": {"metadata": {"annotations": flag}}}})
        if not self._set_workloads_active(job, list(kube_jobs.values()), True):
            self._patch_tiers(job, {"spec": {"suspend": False}})  # no Workload: not queued

    def cancel(self, job: Job) -> None:
        """Delete every Job of this job (any attempt) with its pods, its Service and its
        Secret; what is already gone is fine."""
        namespace = manifests.namespace_name(job.tenant_id)
        if self.kueue_queue():  # the JobSet first, or it would make its Jobs again
            self._delete_jobset(namespace, manifests.jobset_name(job))
        names = {kube_job.metadata.name for kube_job in self._jobs_of(job)}
        names |= {manifests.job_name(job, tier) for tier, _, _ in manifests.tiers(job)}
        for name in sorted(names):
            self._delete_job(namespace, name)
        self.release(job)

    def release(self, job: Job) -> None:
        """After a job has finished: remove its rendezvous Service and its Secret. Its
        finished Jobs and their pods stay (for the logs) until ttlSecondsAfterFinished."""
        namespace = manifests.namespace_name(job.tenant_id)
        self._delete(
            f"service {manifests.service_name(job)}",
            self.core.delete_namespaced_service,
            manifests.service_name(job),
            namespace,
        )
        self._delete(
            f"secret {manifests.secret_name(job)}",
            self.core.delete_namespaced_secret,
            manifests.secret_name(job),
            namespace,
        )

    # --- observation ----------------------------------------------------------------------------
    def _attempt_pods(self, job: Job) -> list[Any]:
        namespace = manifests.namespace_name(job.tenant_id)
        listed = self._call(
            f"listing the pods of job {job.pk}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=(
                f"{manifests.JOB_LABEL}={job.pk},{manifests.ATTEMPT_LABEL}={job.attempt}"
            ),
            ok=(404,),
        )
        return listed.items if listed is not None else []

    def observe(self, job: Job) -> Observation:
        """The attempt's state, from its tier Jobs and their pods.

        Precedence: a failed tier decides (preempted when a pod carries a DisruptionTarget
        condition, else failed with the deadline or the container's exit); then all tiers
        Complete → succeeded; Jobs gone → missing; suspended with no pods left →
        suspended; every rank Running (or done) → running; otherwise pending with the
        reason (unschedulable, quota, image pull). When one tier has failed, the tiers
        still running are deleted: a rank lost ends the whole attempt, as
        podFailurePolicy does within one Job.
        """
        namespace = manifests.namespace_name(job.tenant_id)
        found = self._attempt_jobs(job)
        kube_jobs = {tier: found.get(tier) for tier, _, _ in manifests.tiers(job)}
        present = {tier: kube_job for tier, kube_job in kube_jobs.items() if kube_job is not None}
        pods = self._attempt_pods(job) if present else []

        failed = [
            (tier, kube_job, _condition(kube_job, "Failed"))
            for tier, kube_job in present.items()
            if _condition(kube_job, "Failed")
        ]
        if failed:
            for kube_job in present.values():
                if not _is_finished(kube_job):
                    self._delete_job(namespace, kube_job.metadata.name)
            return self._failure(job, failed, pods)
        if len(present) < len(kube_jobs) and self._jobset_exists(job):
            return Observation(phase="pending", reason="the JobSet is creating its Jobs")
        if not present:
            return Observation(phase="missing", reason="the attempt's Kubernetes Jobs are gone")
        if len(present) < len(kube_jobs):
            gone = sorted(t.replace("_", "-") for t in kube_jobs if t not in present)
            return Observation(
                phase="missing", reason=f"the {', '.join(gone)} Kubernetes Job is gone"
            )
        if all(_condition(kube_job, "Complete") for kube_job in present.values()):
            return Observation(phase="succeeded", exit_code=0)

        live = [p for p in pods if p.status and p.status.phase in ("Pending", "Running", None)]
        suspended = [kube_job for kube_job in present.values() if kube_job.spec.suspend]
        if suspended and job.status != "pausing" and self._kueue_managed(suspended):
            # Created (or resumed) suspended: Kueue hasn't admitted it yet.
            return Observation(phase="pending", reason=self._kueue_wait_reason(job, suspended))
        if suspended:
            if all(kube_job.spec.suspend for kube_job in present.values()) and not live:
                return Observation(phase="suspended")
            return Observation(phase="pending", reason="stopping")

        ranks = current_pods(pods)
        running = sum(1 for p in ranks.values() if p.status.phase == "Running")
        done = sum(1 for p in ranks.values() if p.status.phase == "Succeeded")
        if running and running + done >= job.nodes:
            return Observation(phase="running")
        return self._pending(job, ranks, present, running)

    def _failure(
        self, job: Job, failed: list[tuple[str, Any, Any]], pods: list[Any]
    ) -> Observation:
        ranks = current_pods(pods)
        for _, _, condition in failed:
            if condition.reason != "PodFailurePolicy":
                continue
            for rank, pod in ranks.items():
                disruption = _condition(pod, "DisruptionTarget")
                if disruption is not None:
                    detail = (
                        f"{disruption.reason}: {disruption.message}"
                        if disruption.message
                        else disruption.reason
                    )
                    return Observation(
                        phase="preempted", reason=f"rank {rank} disrupted ({detail})"[:500]
                    )
        _, _, condition = failed[0]
        if condition.reason == "DeadlineExceeded":
            return Observation(
                phase="failed",
                reason=f"exceeded the maximum runtime of {job.max_runtime_minutes} minutes",
            )
        for rank, pod in ranks.items():
            if pod.status.phase != "Failed":
                continue
            status = _main_status(pod)
            terminated = status.state.terminated if status and status.state else None
            if terminated is not None:
                code = terminated.exit_code
                why = TERMINATION_REASONS.get(terminated.reason or "")
                text = f"{why}, exit code {code}" if why else f"exit code {code}"
                if terminated.message:
                    text += f": {terminated.message.strip()}"
                return Observation(
                    phase="failed", reason=f"rank {rank}: {text}"[:500], exit_code=code
                )
            waiting = status.state.waiting if status and status.state else None
            if waiting is not None:
                return Observation(
                    phase="failed",
                    reason=f"rank {rank}: {waiting.reason}: {waiting.message or ''}"[:500],
                )
        return Observation(phase="failed", reason=f"{condition.reason}: {condition.message}"[:500])

    def _pending(
        self, job: Job, ranks: dict[int, Any], present: dict[str, Any], running: int
    ) -> Observation:
        for rank, pod in ranks.items():
            status = _main_status(pod)
            waiting = status.state.waiting if status and status.state else None
            if waiting is None:
                continue
            message = f"rank {rank}: {waiting.reason}: {waiting.message or ''}".strip()
            fatal = waiting.reason in FATAL_WAITING_REASONS or (
                waiting.reason in PULL_WAITING_REASONS
                and any(hint in (waiting.message or "").lower() for hint in FATAL_PULL_HINTS)
            )
            if fatal:
                return Observation(phase="failed", reason=f"image can't be pulled: {message}"[:500])
            if waiting.reason in PULL_WAITING_REASONS:
                return Observation(phase="pending", reason=f"pulling the image: {message}"[:500])
        for rank, pod in ranks.items():
            scheduled = next(
                (c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None
            )
            if scheduled is not None and scheduled.status == "False":
                return Observation(
                    phase="pending", reason=f"rank {rank} unschedulable: {scheduled.message}"[:500]
                )
        if len(ranks) < job.nodes:
            namespace = manifests.namespace_name(job.tenant_id)
            for kube_job in present.values():
                events = self._call(
                    "listing Job events",
                    self.core.list_namespaced_event,
                    namespace,
                    field_selector=(
                        f"involvedObject.name={kube_job.metadata.name},reason=FailedCreate"
                    ),
                    ok=(404,),
                )
                for event in (events.items if events else [])[-1:]:
                    return Observation(
                        phase="pending", reason=f"can't create pods: {event.message}"[:500]
                    )
        if running:
            return Observation(phase="pending", reason=f"{running} of {job.nodes} nodes running")
        return Observation(phase="pending", reason="waiting for pods")

    # --- logs -------------------------------------------------------------------------------------
    def log_sources(self, job: Job) -> list[LogSource]:
        """The main container log of the newest pod of each rank, once it has started."""
        sources = []
        for rank, pod in current_pods(self._attempt_pods(job)).items():
            state = getattr(_main_status(pod), "state", None)
            if state is None or (state.running is None and state.terminated is None):
                continue  # waiting: the API has no log to give yet (400)
            sources.append(
                LogSource(
                    rank=rank,
                    key=f"{pod.metadata.name}/{pod.metadata.uid}",
                    live=state.terminated is None,
                )
            )
        return sources

    def open_log(
        self,
        job: Job,
        source: LogSource,
        *,
        skip: int = 0,
        follow: bool = True,
        wake: Callable[[], None] | None = None,
    ) -> PodLogStream:
        stream = PodLogStream(
            self.core,
            manifests.namespace_name(job.tenant_id),
            source,
            skip=skip,
            follow=follow,
            wake=wake,
        )
        stream.start()
        return stream

    def logs(self, job: Job, since_line: int = 0, limit: int = 1000) -> list[LogLine]:
        """The attempt's log lines after `since_line`, numbered globally rank by rank: all
        of rank 0's lines (1…k), then rank 1's, and so on (rank = completion index +
        tier offset; the newest pod of each rank). Within a rank the order is the
        container's. While several ranks still write, a later rank's numbers move up as
        earlier ranks grow; the numbering is final once the attempt has ended (and always
        for one-node jobs). Pods not started yet, or gone, contribute no lines."""
        namespace = manifests.namespace_name(job.tenant_id)
        lines: list[LogLine] = []
        number = 0
        for rank, pod in current_pods(self._attempt_pods(job)).items():
            text = self._call(
                f"reading the log of {pod.metadata.name}",
                self.core.read_namespaced_pod_log,
                pod.metadata.name,
                namespace,
                container=manifests.CONTAINER,
                ok=(400, 404),
            )
            for line in (text or "").splitlines():
                number += 1
                if number > since_line:
                    lines.append(LogLine(line_no=number, rank=rank, text=line))
                    if len(lines) >= limit:
                        return lines
        return lines


# Seconds a followed pod log may stay silent before the connection is renewed (a quiet
# job then costs one reconnect per interval; a dead connection is noticed in this time).
FOLLOW_READ_TIMEOUT = 300


class PodLogStream:
    """One pod's main-container log through the pod log API (`jobs.backends.base.LogStream`).

    With `follow=True` a daemon thread holds one streaming response (`follow=True`,
    `_preload_content=False`) and collects complete lines as the kubelet sends them;
    with `follow=False` the log so far is read once. The API cannot start at a line, so
    the first `skip` lines are read and dropped. A last line without its newline counts
    only once the container has stopped (its text can't change any more)."""

    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        source: LogSource,
        *,
        skip: int = 0,
        follow: bool = True,
        wake: Callable[[], None] | None = None,
    ):
        self.core = core
        self.namespace = namespace
        self.source = source
        self.skip = skip
        self.follow = follow
        self.wake = wake or (lambda: None)
        self.pod_name = source.key.split("/", 1)[0]
        self.error = ""
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._finished = False  # the reading side is done
        self._closed = False
        self._response: Any = None

    def start(self) -> None:
        if self.follow:
            name = f"pod-log-{self.pod_name}"
            threading.Thread(target=self._read, name=name, daemon=True).start()
        else:
            self._read()

    def poll(self) -> list[str]:
        with self._lock:
            lines, self._lines = self._lines, []
        return lines

    @property
    def ended(self) -> bool:
        with self._lock:
            return self._finished and not self._lines

    def close(self) -> None:
        with self._lock:
            self._closed = True
            response = self._response
        if response is not None:
            # Unblocks the reading thread's recv at once (it then releases the response).
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                response.shutdown()

    def _read(self) -> None:
        response = None
        seen = 0  # lines of the source read so far, skipped ones included
        pending = b""
        clean_end = False
        try:
            response = self.core.read_namespaced_pod_log(
                self.pod_name,
                self.namespace,
                container=manifests.CONTAINER,
                follow=self.follow,
                _preload_content=False,
                _request_timeout=(settings.KUBERNETES_REQUEST_TIMEOUT, FOLLOW_READ_TIMEOUT),
            )
            with self._lock:
                if self._closed:
                    return
                self._response = response
            while True:
                data = response.read1(1 << 16)  # returns what has arrived, unlike read()
                if not data:
                    clean_end = True
                    break
                complete, newline, pending = (pending + data).rpartition(b"\n")
                if newline:
                    seen = self._add(complete.split(b"\n"), seen)
        except ApiException as error:
            if error.status not in (400, 404):  # not started yet / gone: nothing to read
                self.error = api_message(error)
        except (HTTPError, OSError, ValueError) as error:
            self.error = str(error)
        finally:
            # The end of a follow means the container stopped; a snapshot is final only if
            # it had stopped when listed. A closed stream's partial line may grow still.
            stopped = self.follow or not self.source.live
            if clean_end and pending and stopped and not self._closed:
                self._add([pending], seen)
            if self.error and not self._closed:
                log.warning("reading the log of pod %s: %s", self.pod_name, self.error)
            if response is not None:
                response.close()
                response.release_conn()
            with self._lock:
                self._finished = True
            self.wake()

    def _add(self, raws: list[bytes], seen: int) -> int:
        texts = [raw.decode(errors="replace").rstrip("\r") for raw in raws]
        fresh = texts[max(0, self.skip - seen) :]
        if fresh:
            with self._lock:
                self._lines.extend(fresh)
            self.wake()
        return seen + len(texts)
