"""A service's Kubernetes objects, built as plain dicts (no API calls, no database
writes), golden-tested in tests/services/test_kubernetes_manifests.py.

In the tenant's namespace `gg-t-<tenant>` (the jobs' namespace: Pod Security
"restricted", quota, default-deny NetworkPolicy), a service `<id>` is:

- a Deployment `gg-svc-<id>` whose pod template is the current revision (a new revision
  is a rolling update: one pod more at most, none unavailable), with a readiness probe on
  `readiness_path`, `PORT` set to the port, its secrets from a Secret per revision and
  its volumes' claims mounted read-only;
- a ClusterIP Service `gg-svc-<id>` over the ready pods (for in-cluster callers; the
  console's gateway goes to the pods' addresses itself, to balance and drain per pod);
- a NetworkPolicy `gg-svc-<id>` admitting traffic to the port only from the console's
  gateway pods (the namespace's default policy admits nothing from outside it);
- with `autoscale: cpu` or `gpu`, an `autoscaling/v2` HorizontalPodAutoscaler
  `gg-svc-<id>` between min and max replicas (GPU: the `gpu_utilization` pods metric);
  with `rps|concurrency` the console decides the count from its gateway's counters and
  sets the Deployment's `replicas` itself;
- GPU replicas ask for `gpus_per_replica` of their type's resource on its nodes.
"""

from __future__ import annotations

from typing import Any

from jobs.backends.kubernetes.manifests import (
    CONTAINER,
    INSTALLATION_LABEL,
    PRIORITY_CLASSES,
    REGION_LABEL,
    RUN_AS,
    TENANT_LABEL,
    gateway_peer,
    managed_labels,
    namespace_name,
    pod_volumes,
    setting,
)
from jobs.extensions import VolumeMount
from services.models import CLUSTER_METRICS, AutoscaleMetric, Service, ServiceRevision

SERVICE_LABEL = "gpugeek.io/service"
REVISION_LABEL = "gpugeek.io/revision"
# Which pod a ReplicaSet removes first when the count goes down: the console sets it on
# the pods it drained, so a scale-down never removes a pod that still serves.
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# A deleted pod serves on (its preStop sleep) for this many reconcile intervals: a rollout's
# Deployment deletes old pods on its own, and the gateway learns of it at the next pass.
DRAIN_PASSES = 3
# The pods metric a GPU-scaled service's HPA reads: GPU utilisation in percent per pod.
GPU_METRIC = "gpu_utilization"


def object_name(service_id: int) -> str:
    return f"gg-svc-{service_id}"


def secret_name(service: Service, revision: ServiceRevision) -> str:
    return f"gg-svc-{service.pk}-r{revision.number}"


def selector_labels(service_id: int) -> dict[str, str]:
    """What selects the service's pods (never changes: a Deployment's selector is fixed)."""
    return {
        INSTALLATION_LABEL: managed_labels()[INSTALLATION_LABEL],
        SERVICE_LABEL: str(service_id),
    }


def service_labels(service: Service) -> dict[str, str]:
    return {
        **managed_labels(),
        SERVICE_LABEL: str(service.pk),
        TENANT_LABEL: str(service.tenant_id),
    }


def uses_hpa(service: Service) -> bool:
    return service.autoscale_metric in CLUSTER_METRICS


def _metadata(service: Service, name: str | None = None) -> dict[str, Any]:
    return {
        "name": name or object_name(service.pk),
        "namespace": namespace_name(service.tenant_id),
        "labels": service_labels(service),
    }


def secret_manifest(service: Service, revision: ServiceRevision, values: dict[str, str]) -> dict:
    """The organisation secrets a revision names, with their values when it was applied."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(service, secret_name(service, revision)),
        "type": "Opaque",
        "stringData": dict(sorted(values.items())),
    }


def _env(revision: ServiceRevision, secret: str | None) -> list[dict]:
    env: list[dict] = [{"name": "PORT", "value": str(revision.port)}]
    env += [{"name": str(k), "value": str(v)} for k, v in sorted(revision.env.items())]
    env += [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name}}}
        for name in sorted(revision.secrets)
    ]
    return env


def deployment_manifest(
    service: Service,
    revision: ServiceRevision,
    *,
    image_reference: str,
    replicas: int,
    secret: str | None = None,
    volumes: list[VolumeMount] | None = None,
) -> dict:
    """The Deployment of the revision. `replicas`: the console's count (with an HPA, the
    count to start from; the HPA sets it afterwards). `volumes`: the revision's, read-only
    (every pod mounts the same claims)."""
    pool = service.pool
    node_selector = {REGION_LABEL: service.region.slug}
    gpu_type = service.gpu_type if revision.gpus_per_replica else None
    if gpu_type is not None:
        node_selector[gpu_type.node_label_key] = gpu_type.node_label_value
    node_selector.update({str(k): str(v) for k, v in (pool.node_selector or {}).items()})
    memory_gib = 2 * revision.cpus
    if gpu_type is not None and pool.gpus_per_node and pool.memory_gib_per_node:
        # A GPU replica gets its GPUs' share of the node's memory (10 % kept for daemons),
        # as a job does: a model is loaded through host memory.
        share = pool.memory_gib_per_node * revision.gpus_per_replica / pool.gpus_per_node
        memory_gib = max(memory_gib, int(share * 0.9))
    resources = {"cpu": str(revision.cpus), "memory": f"{memory_gib}Gi"}
    if gpu_type is not None:
        resources[gpu_type.resource_name] = str(revision.gpus_per_replica)
    resources["ephemeral-storage"] = str(setting("KUBERNETES_EPHEMERAL_STORAGE", "20Gi"))
    drain = DRAIN_PASSES * int(setting("SERVICE_RECONCILE_INTERVAL", 5))
    probe = {
        "httpGet": {"path": service.readiness_path, "port": "http"},
        "periodSeconds": 1,
        "timeoutSeconds": 2,
        "failureThreshold": 3,
    }
    container = {
        "name": CONTAINER,
        "image": image_reference,
        # argv, never a shell: the image's entrypoint is replaced by the command as given.
        "command": [str(part) for part in revision.command],
        "env": _env(revision, secret),
        "ports": [{"name": "http", "containerPort": revision.port, "protocol": "TCP"}],
        "readinessProbe": probe,
        # Deleted by the Deployment (a rollout), the pod serves on until a reconcile pass
        # has seen it terminating and the gateway has stopped sending it requests.
        "lifecycle": {"preStop": {"sleep": {"seconds": drain}}},
        "resources": {"limits": dict(resources), "requests": dict(resources)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
    }
    pod_spec: dict[str, Any] = {
        "priorityClassName": PRIORITY_CLASSES[service.priority][0],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # In-flight requests end before the pod does (the gateway drains it first).
        "terminationGracePeriodSeconds": drain + 30,
        "nodeSelector": node_selector,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    if volumes:
        pod_spec["volumes"], container["volumeMounts"] = pod_volumes(volumes)
    if gpu_type is not None:  # GPU nodes are commonly tainted with their resource name
        pod_spec["tolerations"] = [
            {"key": gpu_type.resource_name, "operator": "Exists", "effect": "NoSchedule"}
        ]
    if pool.runtime_class_name:  # an isolated runtime, set by staff
        pod_spec["runtimeClassName"] = pool.runtime_class_name
    labels = {**service_labels(service), REVISION_LABEL: str(revision.number)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(service),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector_labels(service.pk)},
            # New pods ready before old ones go: never fewer ready, one more at most.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def service_manifest(service: Service, revision: ServiceRevision) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(service.pk),
            "ports": [
                {"name": "http", "port": revision.port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def network_policy_manifest(service: Service, revision: ServiceRevision) -> dict:
    """Traffic to the service's port only from the console's gateway pods."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(service),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(service.pk)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [gateway_peer(("web",))],
                    "ports": [{"protocol": "TCP", "port": revision.port}],
                }
            ],
        },
    }


def _hpa_metric(service: Service) -> dict:
    if service.autoscale_metric == AutoscaleMetric.GPU:
        # Per pod, from DCGM's exporter through the cluster's custom-metrics adapter
        # (deploy/kubernetes/prometheus-adapter.yaml: the rule that names it).
        target = {"type": "AverageValue", "averageValue": str(round(service.autoscale_target))}
        return {"type": "Pods", "pods": {"metric": {"name": GPU_METRIC}, "target": target}}
    target = {"type": "Utilization", "averageUtilization": round(service.autoscale_target)}
    return {"type": "Resource", "resource": {"name": "cpu", "target": target}}


def hpa_manifest(service: Service) -> dict:
    """CPU utilisation (of the pods' requests) or GPU utilisation (percent busy, a pods
    metric), averaged over the pods, at the service's target percentage, between its min
    and max replicas. Scale-down waits the service's scale-down delay, as the console's
    own decisions do."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(service),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": object_name(service.pk),
            },
            # An HPA can't scale to zero (checks refuse min_replicas 0 with it).
            "minReplicas": max(1, service.min_replicas),
            "maxReplicas": service.max_replicas,
            "metrics": [_hpa_metric(service)],
            "behavior": {
                "scaleDown": {"stabilizationWindowSeconds": min(3600, service.scale_down_delay)}
            },
        },
    }
