"""The API calls for a service's objects, through the jobs' Kubernetes backend (its
client, namespace set-up, ownership checks and error sorting: BackendUnavailable to
retry, BackendRejected for good).

Every write is idempotent: names are deterministic, an existing object of ours is
brought to what it should be, and a delete of a missing one is done already.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jobs.backends.kubernetes import KubernetesBackend
from jobs.backends.kubernetes.client import MERGE_PATCH, main_container_status, true_condition
from jobs.backends.kubernetes.manifests import (
    CONTAINER,
    managed_labels,
    namespace_name,
    volume_claim_manifest,
)
from jobs.extensions import VolumeMount
from services.kubernetes import manifests
from services.models import Service, ServiceRevision

# Who sets the count: "console", or the HPA as last applied ("hpa <metric> <min>-<max>
# <target>% <delay>s"), so that the HPA is written only when it changes.
AUTOSCALER_ANNOTATION = "gpugeek.io/autoscaler"


def backend() -> KubernetesBackend:
    return KubernetesBackend.from_settings()


@dataclass(frozen=True)
class PodSeen:
    """One of the service's pods as the pass needs it."""

    name: str
    ip: str
    revision: int  # its revision's number (a label of the template)
    ready: bool
    ended: bool  # terminating, succeeded or failed: it serves no more
    restarts: int
    waiting: str  # why its container waits (ImagePullBackOff, CrashLoopBackOff …), if it does
    port: int = 0  # its revision's port (set by the pass, which knows the revisions)


@dataclass(frozen=True)
class DeploymentSeen:
    replicas: int  # (where an HPA scales it, the HPA's count)
    revision: int | None  # the template's revision number
    autoscaler: str


def _label_int(labels: dict[str, str], key: str) -> int | None:
    try:
        return int(labels.get(key, ""))
    except ValueError:
        return None


def pods_list(kube: KubernetesBackend, service: Service) -> list[PodSeen]:
    selector = ",".join(f"{k}={v}" for k, v in manifests.selector_labels(service.pk).items())
    found = kube._call(
        f"listing the pods of service {service.pk}",
        kube.core.list_namespaced_pod,
        namespace_name(service.tenant_id),
        label_selector=selector,
    )
    pods = []
    for pod in found.items:
        status = main_container_status(pod)
        waiting = status.state.waiting if status and status.state else None
        phase = pod.status.phase if pod.status else ""
        pods.append(
            PodSeen(
                name=pod.metadata.name,
                ip=(pod.status.pod_ip if pod.status else None) or "",
                revision=_label_int(pod.metadata.labels or {}, manifests.REVISION_LABEL) or 0,
                ready=true_condition(pod, "Ready") is not None,
                ended=bool(pod.metadata.deletion_timestamp) or phase in ("Succeeded", "Failed"),
                restarts=status.restart_count if status else 0,
                waiting=(waiting.reason or "") if waiting else "",
            )
        )
    return pods


def deployment_read(kube: KubernetesBackend, service: Service) -> DeploymentSeen | None:
    name, namespace = manifests.object_name(service.pk), namespace_name(service.tenant_id)
    found = kube._call(
        f"reading Deployment {name}",
        kube.apps.read_namespaced_deployment,
        name,
        namespace,
        ok=(404,),
    )
    if found is None:
        return None
    annotations = found.metadata.annotations or {}
    template_labels = found.spec.template.metadata.labels or {}
    return DeploymentSeen(
        replicas=found.spec.replicas or 0,
        revision=_label_int(template_labels, manifests.REVISION_LABEL),
        autoscaler=annotations.get(AUTOSCALER_ANNOTATION, "console"),
    )


def _create_or_patch(
    kube: KubernetesBackend, what: str, create: Callable, patch: Callable, body: dict
) -> None:
    """Create the object; one of ours that exists already gets its spec from `body`."""
    namespace = body["metadata"]["namespace"]
    if not kube._create(what, create, namespace, body):
        kube._call(
            f"updating {what}",
            patch,
            body["metadata"]["name"],
            namespace,
            {"spec": body["spec"]},
            _content_type=MERGE_PATCH,
        )


def objects_apply(
    kube: KubernetesBackend,
    service: Service,
    revision: ServiceRevision,
    *,
    seen: DeploymentSeen | None,
    image_reference: str,
    replicas: int,
    secret_values: Callable[[], dict[str, str]],
    volumes: Sequence[VolumeMount] = (),
) -> None:
    """Bring the service's objects to the revision and (unless an HPA sets it) the
    count; only what differs from `seen` (the Deployment as read this pass) is written.
    A volume's claim is made with the first workload that mounts it (409: it exists)."""
    namespace = kube.ensure_namespace(service.tenant_id)
    name = manifests.object_name(service.pk)
    autoscaler = "console"
    if manifests.uses_hpa(service):
        autoscaler = (
            f"hpa {service.autoscale_metric} {service.min_replicas}-{service.max_replicas} "
            f"{round(service.autoscale_target)}% {service.scale_down_delay}s"
        )
    new_revision = seen is None or seen.revision != revision.number
    secret = None
    if revision.secrets:
        secret = manifests.secret_name(service, revision)
        if new_revision:
            body = manifests.secret_manifest(service, revision, secret_values())
            kube._create(f"Secret {secret}", kube.core.create_namespaced_secret, namespace, body)
    if new_revision:
        for mount in volumes:
            claim = volume_claim_manifest(service.tenant_id, mount)
            kube._create(
                f"volume claim {claim['metadata']['name']}",
                kube.core.create_namespaced_persistent_volume_claim,
                namespace,
                claim,
            )
    deployment = manifests.deployment_manifest(
        service,
        revision,
        image_reference=image_reference,
        replicas=replicas,
        secret=secret,
        volumes=list(volumes),
    )
    deployment["metadata"]["annotations"] = {AUTOSCALER_ANNOTATION: autoscaler}
    if new_revision:  # (a new port too: the Service and the policy follow it)
        for what, create, patch, body in (
            (
                f"Service {name}",
                kube.core.create_namespaced_service,
                kube.core.patch_namespaced_service,
                manifests.service_manifest(service, revision),
            ),
            (
                f"NetworkPolicy {name}",
                kube.networking.create_namespaced_network_policy,
                kube.networking.patch_namespaced_network_policy,
                manifests.network_policy_manifest(service, revision),
            ),
        ):
            _create_or_patch(kube, what, create, patch, body)
    if seen is None:
        kube._create(
            f"Deployment {name}", kube.apps.create_namespaced_deployment, namespace, deployment
        )
    else:
        changes: dict[str, Any] = {}
        if new_revision:
            changes["template"] = deployment["spec"]["template"]
        if autoscaler == "console" and seen.replicas != replicas:
            changes["replicas"] = replicas
        body: dict[str, Any] = {"spec": changes} if changes else {}
        if seen.autoscaler != autoscaler:
            body["metadata"] = {"annotations": {AUTOSCALER_ANNOTATION: autoscaler}}
        if body:
            kube._call(
                f"updating Deployment {name}",
                kube.apps.patch_namespaced_deployment,
                name,
                namespace,
                body,
                _content_type=MERGE_PATCH,
            )
    if autoscaler != "console":
        if seen is None or seen.autoscaler != autoscaler:
            _create_or_patch(
                kube,
                f"HorizontalPodAutoscaler {name}",
                kube.autoscaling.create_namespaced_horizontal_pod_autoscaler,
                kube.autoscaling.patch_namespaced_horizontal_pod_autoscaler,
                manifests.hpa_manifest(service),
            )
    elif seen is not None and seen.autoscaler != "console":
        kube._delete(
            f"HorizontalPodAutoscaler {name}",
            kube.autoscaling.delete_namespaced_horizontal_pod_autoscaler,
            name,
            namespace,
        )


def pod_deletion_cost(kube: KubernetesBackend, service: Service, pod: str, cost: int) -> None:
    """Which pod the ReplicaSet removes first when the count goes down (lowest cost)."""
    kube._call(
        f"marking pod {pod}",
        kube.core.patch_namespaced_pod,
        pod,
        namespace_name(service.tenant_id),
        {"metadata": {"annotations": {manifests.DELETION_COST: str(cost)}}},
        ok=(404,),
        _content_type=MERGE_PATCH,
    )


def objects_delete(kube: KubernetesBackend, *, tenant_id: int, service_id: int) -> None:
    """Remove every object of a service (its pods go with the Deployment)."""
    namespace = namespace_name(tenant_id)
    if not kube._namespace_is_ours(tenant_id):
        return
    name = manifests.object_name(service_id)
    for what, delete in (
        (
            f"HorizontalPodAutoscaler {name}",
            kube.autoscaling.delete_namespaced_horizontal_pod_autoscaler,
        ),
        (f"Deployment {name}", kube.apps.delete_namespaced_deployment),
        (f"Service {name}", kube.core.delete_namespaced_service),
        (f"NetworkPolicy {name}", kube.networking.delete_namespaced_network_policy),
    ):
        kube._delete(what, delete, name, namespace)
    labels = {**managed_labels(), manifests.SERVICE_LABEL: str(service_id)}
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    kube._call(
        f"deleting the Secrets of service {service_id}",
        kube.core.delete_collection_namespaced_secret,
        namespace,
        label_selector=selector,
        _preload_content=False,
    )


def pod_log_tail(kube: KubernetesBackend, service: Service, pod: str, *, lines: int) -> str:
    """The last `lines` of the pod's container log ("" before it starts, or once gone)."""
    text = kube._call(
        f"reading the log of {pod}",
        kube.core.read_namespaced_pod_log,
        pod,
        namespace_name(service.tenant_id),
        container=CONTAINER,
        tail_lines=lines,
        ok=(400, 404),
    )
    return text or ""
