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

import json
import logging
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
        return name

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
        for manifest in manifests.job_manifests(job, resumed=resumed):
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
            for kube_job in self._jobs_of(job):
                labels = kube_job.metadata.labels or {}
                if labels.get(manifests.ATTEMPT_LABEL) != str(job.attempt):
                    self._delete_job(namespace, kube_job.metadata.name)
        self._create_attempt(job, resumed=False)

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
        grace period) and keeps the Job and its completed indexes."""
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

    def cancel(self, job: Job) -> None:
        """Delete every Job of this job (any attempt) with its pods, its Service and its
        Secret; what is already gone is fine."""
        namespace = manifests.namespace_name(job.tenant_id)
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
        kube_jobs: dict[str, Any] = {}
        for tier, _, _ in manifests.tiers(job):
            name = manifests.job_name(job, tier)
            kube_jobs[tier] = self._call(
                f"reading Job {name}", self.batch.read_namespaced_job, name, namespace, ok=(404,)
            )
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
        if not present:
            return Observation(phase="missing", reason="the attempt's Kubernetes Jobs are gone")
        if len(present) < len(kube_jobs):
            gone = sorted(manifests.job_name(job, t) for t in kube_jobs if t not in present)
            return Observation(phase="missing", reason=f"Kubernetes Job {', '.join(gone)} is gone")
        if all(_condition(kube_job, "Complete") for kube_job in present.values()):
            return Observation(phase="succeeded", exit_code=0)

        live = [p for p in pods if p.status and p.status.phase in ("Pending", "Running", None)]
        if any(kube_job.spec.suspend for kube_job in present.values()):
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
