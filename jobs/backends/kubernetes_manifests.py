"""Kubernetes objects for a job, built as plain dicts (no API calls, no database writes).

Everything the cluster runs is derived here from the Job row's structured, validated
fields, so the same job always yields the same objects (golden-tested in
tests/jobs/test_kubernetes_manifests.py). Object names are deterministic, which is what
makes `KubernetesBackend.submit` idempotent (409 AlreadyExists means "done already").

Layout of one job (`DESIGN.md`, "Kubernetes, precisely"):

- the tenant's namespace `gg-t-<tenant>` with Pod Security "restricted", a
  ResourceQuota from the tenant's quota, a LimitRange and a default-deny NetworkPolicy;
- a headless Service `gg-<job>` for rendezvous, shared by every attempt and tier;
- a Secret `gg-<job>-env` holding the secret environment variables (when any);
- per registry the tenant stored a login for, a `kubernetes.io/dockerconfigjson` Secret
  `gg-pull-<registry>-<hash>` in its namespace, named in `imagePullSecrets` of the jobs
  whose image comes from that registry;
- per attempt, one Indexed `batch/v1` Job per tier: `gg-<job>-a<attempt>` (on-demand
  ranks 0…k-1) and `gg-<job>-a<attempt>-spot` (spot ranks k…n-1).

Ranks. A pod's global rank is `JOB_COMPLETION_INDEX + GPUGEEK_RANK_OFFSET` (the offset is
the number of on-demand nodes for the spot Job, else 0). Kubernetes can't add numbers in
an env var, so `NODE_RANK` is set (from the completion index) only in a Job whose offset
is 0; in the spot Job of a mixed job the entrypoint computes it, or, better, uses
torchrun's rank-agnostic c10d rendezvous at `MASTER_ADDR:MASTER_PORT`. `MASTER_ADDR` is
the DNS name of rank 0: index 0 of the on-demand Job (of the spot Job when all are spot).

Resume flag. `GPUGEEK_RESUMED` is read through the downward API from the pod annotation
`gpugeek.io/resumed`, because a Job's pod template is immutable except for labels,
annotations and scheduling directives while it is suspended and has not restarted:
resuming flips that annotation together with `spec.suspend` in one patch, under the same
Job name (see KubernetesBackend.resume).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:
    from jobs.models import Job
    from marketplace.models import NodePool, TenantQuota

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpugeek"
JOB_LABEL = "gpugeek.io/job"
TENANT_LABEL = "gpugeek.io/tenant"
ATTEMPT_LABEL = "gpugeek.io/attempt"
TIER_LABEL = "gpugeek.io/tier"
RESUMED_ANNOTATION = "gpugeek.io/resumed"
RANK_OFFSET_ANNOTATION = "gpugeek.io/rank-offset"
REGISTRY_ANNOTATION = "gpugeek.io/registry"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
REGION_LABEL = "topology.kubernetes.io/region"
CONTAINER = "main"
HOME = "/home/gpugeek"
MASTER_PORT = 29500
RUN_AS = 1000
ON_DEMAND, SPOT = "on_demand", "spot"

# Spot/preemptible node taints on the common clouds (and ours); tolerated by spot pods.
SPOT_TOLERATION_KEYS = (
    "gpugeek.io/spot",
    "cloud.google.com/gke-spot",
    "cloud.google.com/gke-preemptible",
    "kubernetes.azure.com/scalesetpriority",
    "eks.amazonaws.com/capacityType",
    "karpenter.sh/capacity-type",
)
# Node labels (key, value) that mark spot capacity; the same set inventory() reads.
SPOT_NODE_LABELS = (
    ("gpugeek.io/tier", "spot"),
    ("cloud.google.com/gke-spot", "true"),
    ("cloud.google.com/gke-preemptible", "true"),
    ("eks.amazonaws.com/capacityType", "SPOT"),
    ("karpenter.sh/capacity-type", "spot"),
    ("kubernetes.azure.com/scalesetpriority", "spot"),
    ("node.kubernetes.io/lifecycle", "spot"),
)
# Egress a job never gets: the cloud metadata endpoint and private ranges (the cluster's
# control plane, nodes, our Postgres/Redis). Override with KUBERNETES_EGRESS_DENY_CIDRS.
DEFAULT_EGRESS_DENY_CIDRS = (
    "169.254.0.0/16",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
    "fe80::/10",
)


# --- settings -----------------------------------------------------------------------------


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
# replicatedJob names of a gang-admitted job's JobSet, per tier.
JOBSET_TIER_NAMES = {ON_DEMAND: "od", SPOT: "spot"}


# --- names --------------------------------------------------------------------------------


def namespace_name(tenant_id: int) -> str:
    return f"gg-t-{tenant_id}"


def service_name(job: Job) -> str:
    return f"gg-{job.pk}"


def secret_name(job: Job) -> str:
    return f"gg-{job.pk}-env"


def registry_secret_name(registry: str) -> str:
    """Deterministic per registry (a namespace is one tenant's): readable host, plus a
    hash so that hosts differing only in characters a name can't hold don't clash."""
    readable = re.sub(r"[^a-z0-9.-]+", "-", registry.lower()).strip(".-")[:40].strip(".-")
    digest = hashlib.sha256(registry.encode()).hexdigest()[:8]
    return f"gg-pull-{readable}-{digest}"


def job_name(job: Job, tier: str, attempt: int | None = None, *, gang: bool = False) -> str:
    base = f"gg-{job.pk}-a{job.attempt if attempt is None else attempt}"
    if gang:  # the JobSet controller names its Jobs <jobset>-<replicatedJob>-<index>
        return f"{base}-{JOBSET_TIER_NAMES[tier]}-0"
    return f"{base}-spot" if tier == SPOT else base


def jobset_name(job: Job) -> str:
    return f"gg-{job.pk}-a{job.attempt}"


def tiers(job: Job) -> list[tuple[str, int, int]]:
    """(tier, nodes, rank offset) of each Kubernetes Job of an attempt, on-demand first."""
    out = []
    if job.on_demand_nodes:
        out.append((ON_DEMAND, job.on_demand_nodes, 0))
    if job.spot_nodes:
        out.append((SPOT, job.spot_nodes, job.on_demand_nodes))
    if not out:  # placement not recorded (never for admitted jobs): all on-demand
        out.append((ON_DEMAND, job.nodes, 0))
    return out


def is_gang(job: Job, kueue_queue: str | None) -> bool:
    """Whether the attempt is one JobSet: a job split over both tiers, under Kueue (see
    `jobset_manifest` for why)."""
    return bool(kueue_queue) and len(tiers(job)) > 1


def master_addr(job: Job, *, gang: bool = False) -> str:
    first_tier = tiers(job)[0][0]
    return f"{job_name(job, first_tier, gang=gang)}-0.{service_name(job)}"


def job_labels(job: Job, tier: str | None = None) -> dict[str, str]:
    labels = {
        MANAGED_BY: MANAGER,
        JOB_LABEL: str(job.pk),
        TENANT_LABEL: str(job.tenant_id),
        ATTEMPT_LABEL: str(job.attempt),
    }
    if tier:
        labels[TIER_LABEL] = tier
    return labels


def _owner_labels(job: Job) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, JOB_LABEL: str(job.pk), TENANT_LABEL: str(job.tenant_id)}


# --- the tenant's namespace --------------------------------------------------------------


def namespace_manifest(tenant_id: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace_name(tenant_id),
            "labels": {
                MANAGED_BY: MANAGER,
                TENANT_LABEL: str(tenant_id),
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/audit": "restricted",
            },
        },
    }


def quota_hard(quotas: list[TenantQuota], gpu_resources: dict[str, list[int]]) -> dict[str, str]:
    """ResourceQuota `hard` limits from the tenant's quotas.

    `gpu_resources` maps each GPU resource name (nvidia.com/gpu, …) to the ids of the GPU
    types using it. A ResourceQuota can't tell GPU products apart, so per resource the
    limit is the tenant-wide GPU quota, or else the sum of the per-type quotas when every
    type of that resource has one; otherwise that resource is left to our admission
    service (which enforces the per-type quotas exactly). This is a backstop, not the
    primary check. Jobs are counted per tier Job, and finished Jobs count until their TTL
    removes them, hence twice the concurrent-jobs quota.
    """
    hard: dict[str, str] = {}
    tenant_wide = next((q for q in quotas if q.gpu_type_id is None), None)
    per_type = {q.gpu_type_id: q.max_gpus for q in quotas if q.gpu_type_id is not None}
    for resource, type_ids in sorted(gpu_resources.items()):
        limit = None
        if tenant_wide is not None and tenant_wide.max_gpus is not None:
            limit = tenant_wide.max_gpus
        elif type_ids and all(per_type.get(t) is not None for t in type_ids):
            limit = sum(per_type[t] for t in type_ids)
        if limit is not None:
            hard[f"requests.{resource}"] = str(limit)
    if tenant_wide is not None and tenant_wide.max_concurrent_jobs is not None:
        hard["count/jobs.batch"] = str(2 * tenant_wide.max_concurrent_jobs)
    return hard


def resource_quota_manifest(tenant_id: int, hard: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": "gpugeek-quota",
            "namespace": namespace_name(tenant_id),
            "labels": {MANAGED_BY: MANAGER, TENANT_LABEL: str(tenant_id)},
        },
        "spec": {"hard": hard},
    }


def limit_range_manifest(tenant_id: int) -> dict:
    """Defaults for any container that states no resources (ours always do)."""
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {
            "name": "gpugeek-defaults",
            "namespace": namespace_name(tenant_id),
            "labels": {MANAGED_BY: MANAGER, TENANT_LABEL: str(tenant_id)},
        },
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "default": {"cpu": "1", "memory": "2Gi"},
                    "defaultRequest": {"cpu": "100m", "memory": "256Mi"},
                }
            ]
        },
    }


def _deny_cidrs() -> tuple[list[str], list[str]]:
    v4, v6 = [], []
    for cidr in _setting("KUBERNETES_EGRESS_DENY_CIDRS", DEFAULT_EGRESS_DENY_CIDRS):
        network = ipaddress.ip_network(cidr, strict=False)
        (v4 if network.version == 4 else v6).append(str(network))
    return v4, v6


def network_policy_manifest(tenant_id: int) -> dict:
    """Default deny. Ingress only from pods of the same namespace (rendezvous); egress to
    those pods, to the cluster DNS, and to the internet except the denied CIDRs."""
    v4, v6 = _deny_cidrs()
    internet: list[dict] = [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": v4}},
        {"ipBlock": {"cidr": "::/0", "except": v6}},
    ]
    for block in internet:
        if not block["ipBlock"]["except"]:
            del block["ipBlock"]["except"]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "gpugeek-default",
            "namespace": namespace_name(tenant_id),
            "labels": {MANAGED_BY: MANAGER, TENANT_LABEL: str(tenant_id)},
        },
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
            "egress": [
                {"to": [{"podSelector": {}}]},
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                            },
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                        }
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
                {"to": internet},
            ],
        },
    }


def namespace_manifests(
    tenant_id: int, quotas: list[TenantQuota], gpu_resources: dict[str, list[int]]
) -> list[dict]:
    """The namespace and its guard rails, in creation order."""
    return [
        namespace_manifest(tenant_id),
        resource_quota_manifest(tenant_id, quota_hard(quotas, gpu_resources)),
        limit_range_manifest(tenant_id),
        network_policy_manifest(tenant_id),
    ]


# --- per job ------------------------------------------------------------------------------


def service_manifest(job: Job) -> dict:
    """Headless, publishing not-ready pods: ranks must resolve each other before any
    readiness, and `<pod hostname>.<service>` is the rendezvous address."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job),
            "namespace": namespace_name(job.tenant_id),
            "labels": _owner_labels(job),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: str(job.pk)},
            "ports": [{"name": "rendezvous", "port": MASTER_PORT, "protocol": "TCP"}]
            + [{"name": p["name"], "port": p["port"], "protocol": "TCP"} for p in job.ports],
        },
    }


def secret_manifest(job: Job, values: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(job),
            "namespace": namespace_name(job.tenant_id),
            "labels": _owner_labels(job),
        },
        "type": "Opaque",
        "stringData": {name: str(value) for name, value in values.items()},
    }


# Docker Hub's credentials are looked up under its v1 index URL, not "docker.io".
DOCKER_HUB_AUTH_KEY = "https://index.docker.io/v1/"


def registry_secret_manifest(tenant_id: int, registry: str, username: str, password: str) -> dict:
    """The tenant's login to `registry` as the kubelet reads it (a docker config.json)."""
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    key = DOCKER_HUB_AUTH_KEY if registry == "docker.io" else registry
    config = {"auths": {key: {"username": username, "password": password, "auth": auth}}}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": registry_secret_name(registry),
            "namespace": namespace_name(tenant_id),
            "labels": {MANAGED_BY: MANAGER, TENANT_LABEL: str(tenant_id)},
            "annotations": {REGISTRY_ANNOTATION: registry},
        },
        "type": "kubernetes.io/dockerconfigjson",
        "data": {
            ".dockerconfigjson": base64.b64encode(
                json.dumps(config, sort_keys=True).encode()
            ).decode()
        },
    }


def _memory_limit(job: Job, pool: NodePool | None) -> str | None:
    """The job's share of a node's allocatable memory (its share of the node's GPUs, or of
    its vCPUs for CPU jobs), keeping 10 % for daemons; None when the pool doesn't say."""
    if pool is None or not pool.memory_gib_per_node:
        return None
    if job.gpus_per_node and pool.gpus_per_node:
        share = min(job.gpus_per_node / pool.gpus_per_node, 1)
    elif pool.vcpus_per_node:
        share = min(job.cpus / pool.vcpus_per_node, 1)
    else:
        return None
    gib = int(pool.memory_gib_per_node * share * 0.9)
    return f"{max(gib, 1)}Gi"


def _node_affinity(tier: str) -> dict:
    """Spot ranks only on spot nodes; on-demand ranks never on spot or reserved nodes."""
    if tier == SPOT:
        terms = [
            {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
            for key, value in SPOT_NODE_LABELS
        ]
    else:
        expressions: list[dict] = [
            {"key": "gpugeek.io/tier", "operator": "NotIn", "values": ["spot", "reserved"]}
        ]
        expressions += [
            {"key": key, "operator": "NotIn", "values": [value]}
            for key, value in SPOT_NODE_LABELS
            if key != "gpugeek.io/tier"
        ]
        terms = [{"matchExpressions": expressions}]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


def _field_env(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env(job: Job, tier: str, offset: int, *, gang: bool = False) -> list[dict]:
    index_path = f"metadata.annotations['{COMPLETION_INDEX}']"
    platform: list[dict] = [
        {"name": "GPUGEEK_JOB_ID", "value": str(job.pk)},
        {"name": "GPUGEEK_ATTEMPT", "value": str(job.attempt)},
        _field_env("GPUGEEK_RESUMED", f"metadata.annotations['{RESUMED_ANNOTATION}']"),
        {"name": "GPUGEEK_CHECKPOINT_PATH", "value": job.checkpoint_path or ""},
        {"name": "GPUGEEK_TIER", "value": tier},
        {"name": "GPUGEEK_RANK_OFFSET", "value": str(offset)},
        _field_env("JOB_COMPLETION_INDEX", index_path),
    ]
    if offset == 0:
        platform.append(_field_env("NODE_RANK", index_path))
    platform += [
        {"name": "WORLD_SIZE", "value": str(job.nodes)},
        {"name": "MASTER_ADDR", "value": master_addr(job, gang=gang)},
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
        {"name": "HOME", "value": HOME},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    # The platform's variables win over a user's of the same name (as on the local
    # backend); NODE_RANK stays ours even where it is unset.
    reserved = {entry["name"] for entry in platform} | {"NODE_RANK"}
    env: list[dict] = [
        {"name": str(name), "value": str(value)}
        for name, value in (job.env or {}).items()
        if name not in reserved
    ]
    env += [
        {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": secret_name(job), "key": name}},
        }
        for name in job.secret_env_names or []
        if name not in reserved
    ]
    return env + platform


def _tolerations(job: Job, tier: str) -> list[dict]:
    tolerations = []
    if job.gpu_type_id and job.gpu_type.resource_name:
        # GPU nodes are commonly tainted with their resource name.
        tolerations.append(
            {"key": job.gpu_type.resource_name, "operator": "Exists", "effect": "NoSchedule"}
        )
    if tier == SPOT:
        tolerations += [{"key": key, "operator": "Exists"} for key in SPOT_TOLERATION_KEYS]
    return tolerations


def job_manifest(
    job: Job,
    tier: str,
    nodes: int,
    offset: int,
    *,
    resumed: bool = False,
    pull_secrets: list[str] | None = None,
    kueue_queue: str | None = None,
    gang: bool = False,
) -> dict:
    """One tier's Indexed Job of the job's current attempt. `pull_secrets`: names of the
    image pull Secrets for its image's registry (see `registry_secret_manifest`).
    `kueue_queue`: the tenant's LocalQueue when Kueue admits jobs; `gang`: the Job is a
    template inside the attempt's JobSet (which carries the queue label instead)."""
    pool = job.spot_pool if tier == SPOT else job.pool
    labels = job_labels(job, tier)
    job_metadata_labels = dict(labels)
    if kueue_queue and not gang:
        job_metadata_labels[KUEUE_QUEUE_LABEL] = kueue_queue

    node_selector = {REGION_LABEL: job.region.slug}
    if job.gpu_type_id:
        node_selector[job.gpu_type.node_label_key] = job.gpu_type.node_label_value
    if pool is not None:
        node_selector.update({str(k): str(v) for k, v in (pool.node_selector or {}).items()})

    resources: dict[str, str] = {"cpu": str(job.cpus)}
    memory = _memory_limit(job, pool)
    if memory:
        resources["memory"] = memory
    if job.gpu_type_id and job.gpus_per_node:
        resources[job.gpu_type.resource_name] = str(job.gpus_per_node)

    container = {
        "name": CONTAINER,
        "image": job.image_reference,
        # argv, never a shell: the image's entrypoint is replaced by the command as given.
        "command": [str(arg) for arg in job.command],
        "env": _env(job, tier, offset, gang=gang),
        "resources": {"limits": dict(resources), "requests": dict(resources)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": False,
            "runAsNonRoot": True,
        },
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},  # noqa: S108  (NCCL shared memory)
            {"name": "home", "mountPath": HOME},
        ],
    }
    if job.ports:  # e.g. Jupyter or SSH, reachable through the job's Service
        container["ports"] = [
            {"name": p["name"], "containerPort": p["port"], "protocol": "TCP"} for p in job.ports
        ]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": service_name(job),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.JOB_TERMINATION_GRACE_SECONDS,
        "nodeSelector": node_selector,
        "affinity": _node_affinity(tier),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "home", "emptyDir": {}},
        ],
    }
    tolerations = _tolerations(job, tier)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    # The tenant's own login for the image's registry first, then any cluster-wide ones.
    pull_secret_names = list(pull_secrets or [])
    pull_secret_names += [
        name
        for name in _setting("KUBERNETES_IMAGE_PULL_SECRETS", []) or []
        if name not in pull_secret_names
    ]
    if pull_secret_names:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in pull_secret_names]

    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": 0,
        # A disrupted rank (spot reclaim, eviction, node loss) ends the attempt as
        # "preempted"; the console requeues a new attempt from the checkpoint.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                }
            ]
        },
        "activeDeadlineSeconds": job.max_runtime_minutes * 60,
        # Kueue admits a queued Job by unsuspending it (its webhook would suspend it anyway).
        "suspend": bool(kueue_queue),
        "template": {
            "metadata": {
                "labels": labels,
                "annotations": {
                    RESUMED_ANNOTATION: "1" if resumed else "0",
                    RANK_OFFSET_ANNOTATION: str(offset),
                },
            },
            "spec": pod_spec,
        },
    }
    if job.auto_release and not gang:  # a JobSet's Jobs go with the JobSet
        spec["ttlSecondsAfterFinished"] = int(
            _setting("KUBERNETES_TTL_SECONDS_AFTER_FINISHED", 3600)
        )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(job, tier, gang=gang),
            "namespace": namespace_name(job.tenant_id),
            "labels": job_metadata_labels,
        },
        "spec": spec,
    }


def job_manifests(
    job: Job,
    *,
    resumed: bool = False,
    pull_secrets: list[str] | None = None,
    kueue_queue: str | None = None,
) -> list[dict]:
    """The attempt's Kubernetes Jobs, on-demand tier first (it holds rank 0)."""
    return [
        job_manifest(
            job,
            tier,
            nodes,
            offset,
            resumed=resumed,
            pull_secrets=pull_secrets,
            kueue_queue=kueue_queue,
        )
        for tier, nodes, offset in tiers(job)
    ]


def jobset_manifest(
    job: Job,
    *,
    kueue_queue: str,
    resumed: bool = False,
    pull_secrets: list[str] | None = None,
) -> dict:
    """The attempt of a job split over spot and on-demand nodes, as one JobSet.

    Why a JobSet: under Kueue each tier's Job would be its own Workload, admitted on its
    own, so one tier could hold its GPUs while the other waits (a deadlock for a training
    run that needs every rank). Kueue gang-admits several Jobs only as one object: it
    supports JobSet (jobset.x-k8s.io) natively, one Workload with a pod set per
    replicatedJob, admitted all or nothing. Its other multi-pod mechanisms don't fit:
    pod groups (`kueue.x-k8s.io/pod-group-name`) are for plain Pods, and a prebuilt
    Workload (`kueue.x-k8s.io/prebuilt-workload-name`) belongs to a single Job.

    The JobSet runs the same Indexed Job per tier as `job_manifests` (named
    `<jobset>-od-0` and `<jobset>-spot-0` by the JobSet controller), keeps our headless
    Service (its own DNS hostnames are off), fails on the first failed Job (a lost rank
    ends the attempt, as podFailurePolicy does within a Job) and succeeds when all do.
    It is created suspended with the queue label; Kueue unsuspends it, and the JobSet
    controller its Jobs.
    """
    replicated = []
    for tier, nodes, offset in tiers(job):
        manifest = job_manifest(
            job,
            tier,
            nodes,
            offset,
            resumed=resumed,
            pull_secrets=pull_secrets,
            kueue_queue=kueue_queue,
            gang=True,
        )
        template_spec = dict(manifest["spec"])
        template_spec.pop("suspend")  # the JobSet's suspend governs its Jobs
        replicated.append(
            {
                "name": JOBSET_TIER_NAMES[tier],
                "replicas": 1,
                "template": {
                    "metadata": {"labels": manifest["metadata"]["labels"]},
                    "spec": template_spec,
                },
            }
        )
    spec: dict[str, Any] = {
        "suspend": True,
        "network": {"enableDNSHostnames": False},
        "failurePolicy": {"maxRestarts": 0},
        "successPolicy": {"operator": "All"},
        "replicatedJobs": replicated,
    }
    if job.auto_release:
        spec["ttlSecondsAfterFinished"] = int(
            _setting("KUBERNETES_TTL_SECONDS_AFTER_FINISHED", 3600)
        )
    return {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": jobset_name(job),
            "namespace": namespace_name(job.tenant_id),
            "labels": {**job_labels(job), KUEUE_QUEUE_LABEL: kueue_queue},
        },
        "spec": spec,
    }


def local_queue_manifest(tenant_id: int, queue: str, cluster_queue: str) -> dict:
    """The tenant's Kueue LocalQueue: its jobs queue in the platform's ClusterQueue."""
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "LocalQueue",
        "metadata": {
            "name": queue,
            "namespace": namespace_name(tenant_id),
            "labels": {MANAGED_BY: MANAGER, TENANT_LABEL: str(tenant_id)},
        },
        "spec": {"clusterQueue": cluster_queue},
    }
