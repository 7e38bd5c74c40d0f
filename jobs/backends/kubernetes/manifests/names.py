"""Names, labels and shared constants of our Kubernetes objects.

Deterministic names (`gg-<job>-a<attempt>`, `gg-t-<tenant>`, …) are what make every
create idempotent; the labels are how the backend and the watch find our objects.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:
    from jobs.models import Job

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpugeek"
JOB_LABEL = "gpugeek.io/job"
TENANT_LABEL = "gpugeek.io/tenant"
ATTEMPT_LABEL = "gpugeek.io/attempt"
TIER_LABEL = "gpugeek.io/tier"
# Which console made an object: two installations may share a cluster (and tenant ids),
# so every object carries it, lists and watches select on it, and a 409 on create is
# "done already" only for an object that carries ours (see ApiCalls._create).
INSTALLATION_LABEL = "gpugeek.io/installation"
RESUMED_ANNOTATION = "gpugeek.io/resumed"
# GPUGEEK_RESUME_FROM, read like GPUGEEK_RESUMED: a resume patches it with the flag.
RESUME_FROM_ANNOTATION = "gpugeek.io/resume-from"
RANK_OFFSET_ANNOTATION = "gpugeek.io/rank-offset"
REGISTRY_ANNOTATION = "gpugeek.io/registry"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
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


def setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


# Where the console's gateways run (deploy/kubernetes: namespace gpugeek): its web pods
# (the services gateway, the Jupyter proxy) and its SSH gateway's. The only pods outside a
# tenant's namespace that reach its workloads, on the ports those declare.
GATEWAY_NAMESPACE = "gpugeek"
GATEWAY_APP_LABELS = {"app.kubernetes.io/name": "gpugeek"}
GATEWAY_COMPONENTS = ("web", "ssh-gateway")


def gateway_peer(components: tuple[str, ...] = GATEWAY_COMPONENTS) -> dict:
    """A NetworkPolicy peer: the console's pods of `components`, in its namespace."""
    namespace = setting("SERVICE_GATEWAY_NAMESPACE", GATEWAY_NAMESPACE)
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {
            "matchLabels": dict(GATEWAY_APP_LABELS),
            "matchExpressions": [
                {
                    "key": "app.kubernetes.io/component",
                    "operator": "In",
                    "values": list(components),
                }
            ],
        },
    }


KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
SCHEDULING_GROUP, SCHEDULING_VERSION = "scheduling.k8s.io", "v1"

# A job's priority on the cluster: the PriorityClass (and, under Kueue, the
# WorkloadPriorityClass) of each GpuGeek priority, by name and value. All below the
# console's own class (deploy/kubernetes/priorityclass.yaml, 1000000), so tenant work
# never preempts the control plane.
PRIORITY_CLASSES = {
    "low": ("gpugeek-low", 1000),
    "normal": ("gpugeek-normal", 10000),
    "critical": ("gpugeek-critical", 100000),
}


def priority_class_name(job: Job) -> str:
    return PRIORITY_CLASSES[job.priority][0]


JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
# replicatedJob names of a gang-admitted job's JobSet, per tier.
JOBSET_TIER_NAMES = {ON_DEMAND: "od", SPOT: "spot"}


def installation_id() -> str:
    return settings.GPUGEEK_INSTALLATION_ID


def managed_labels() -> dict[str, str]:
    """The labels of every object the console creates."""
    return {MANAGED_BY: MANAGER, INSTALLATION_LABEL: installation_id()}


def managed_selector(**labels: str) -> str:
    """A label selector for this installation's objects, narrowed by `labels`."""
    return ",".join(f"{key}={value}" for key, value in {**managed_labels(), **labels}.items())


# --- names --------------------------------------------------------------------------------


def namespace_name(tenant_id: int) -> str:
    return f"gg-t-{tenant_id}"


def service_name(job: Job) -> str:
    return f"gg-{job.pk}"


def secret_name(job: Job) -> str:
    return f"gg-{job.pk}-env"


def published_name(job: Job) -> str:
    """The ConfigMap of the files the console publishes to the job (publish_file)."""
    return f"gg-{job.pk}-files"


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


def needs_service(job: Job) -> bool:
    """Whether the job gets its headless Service: for its pods to find each other (more
    than one node) or to be reached on its ports. A lone pod without ports needs none,
    which saves an object (and an API call) per launch."""
    return job.nodes > 1 or bool(job.ports)


def master_addr(job: Job, *, gang: bool = False) -> str:
    if not needs_service(job):
        return "localhost"  # rank 0 is the pod itself
    first_tier = tiers(job)[0][0]
    return f"{job_name(job, first_tier, gang=gang)}-0.{service_name(job)}"


def job_labels(job: Job, tier: str | None = None) -> dict[str, str]:
    labels = {
        **managed_labels(),
        JOB_LABEL: str(job.pk),
        TENANT_LABEL: str(job.tenant_id),
        ATTEMPT_LABEL: str(job.attempt),
    }
    if tier:
        labels[TIER_LABEL] = tier
    return labels


def owner_labels(job: Job) -> dict[str, str]:
    return {**managed_labels(), JOB_LABEL: str(job.pk), TENANT_LABEL: str(job.tenant_id)}
