"""Per-job objects: the rendezvous Service, the env Secret, image pull Secrets, one
Indexed Job per tier (or one JobSet for a gang-admitted split job) and the Kueue
LocalQueue.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from django.conf import settings

from jobs.backends.base import node_memory_share
from jobs.backends.kubernetes.manifests.names import (
    COMPLETION_INDEX,
    CONTAINER,
    HOME,
    JOB_LABEL,
    JOBSET_GROUP,
    JOBSET_TIER_NAMES,
    JOBSET_VERSION,
    KUEUE_GROUP,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_VERSION,
    MANAGED_BY,
    MANAGER,
    MASTER_PORT,
    PRIORITY_CLASSES,
    RANK_OFFSET_ANNOTATION,
    REGION_LABEL,
    REGISTRY_ANNOTATION,
    RESUME_FROM_ANNOTATION,
    RESUMED_ANNOTATION,
    RUN_AS,
    SCHEDULING_GROUP,
    SCHEDULING_VERSION,
    SPOT,
    SPOT_NODE_LABELS,
    SPOT_TOLERATION_KEYS,
    TENANT_LABEL,
    gateway_peer,
    job_labels,
    job_name,
    jobset_name,
    managed_labels,
    master_addr,
    namespace_name,
    needs_service,
    owner_labels,
    priority_class_name,
    registry_secret_name,
    secret_name,
    service_name,
    setting,
    tiers,
)
from jobs.backends.kubernetes.manifests.volumes import pod_volumes
from jobs.checkpoints.store import job_checkpoint_environment

if TYPE_CHECKING:
    from jobs.extensions import VolumeMount
    from jobs.models import Job
    from marketplace.models import NodePool

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
            "labels": owner_labels(job),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: str(job.pk)},
            "ports": [{"name": "rendezvous", "port": MASTER_PORT, "protocol": "TCP"}]
            + [{"name": p["name"], "port": p["port"], "protocol": "TCP"} for p in job.ports],
        },
    }


def ports_policy_manifest(job: Job) -> dict:
    """The job's declared ports (Jupyter, SSH) open to the console's gateways only: the
    namespace's default policy admits nothing from outside it. Named as its Service."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": service_name(job),
            "namespace": namespace_name(job.tenant_id),
            "labels": owner_labels(job),
        },
        "spec": {
            "podSelector": {"matchLabels": {JOB_LABEL: str(job.pk)}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [gateway_peer()],
                    "ports": [{"protocol": "TCP", "port": p["port"]} for p in job.ports],
                }
            ],
        },
    }


def secret_manifest(job: Job, values: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(job),
            "namespace": namespace_name(job.tenant_id),
            "labels": owner_labels(job),
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
            "labels": {**managed_labels(), TENANT_LABEL: str(tenant_id)},
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
    """The job's share of a node's allocatable memory, keeping 10 % for daemons; None when
    the pool doesn't say."""
    share = node_memory_share(job, pool)
    if share is None or not pool or not pool.memory_gib_per_node:
        return None
    gib = int(pool.memory_gib_per_node * share * 0.9)
    return f"{max(gib, 1)}Gi"


def _node_affinity(tier: str, avoid: list[str]) -> dict:
    """Spot ranks only on spot nodes; on-demand ranks never on spot or reserved nodes;
    neither on the nodes in `avoid` (suspect: jobs.repair)."""
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
    if avoid:
        away = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": avoid}
        terms = [{"matchExpressions": [*term["matchExpressions"], away]} for term in terms]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


def _field_env(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _checkpoint_env(job: Job) -> dict[str, str]:
    return job_checkpoint_environment(
        tenant_id=job.tenant_id, job_id=job.pk, resume_from=job.resume_from
    )


# Store credentials (and the job's token, for events and renewals) reach the pod from the job's
# Secret, never as values in the Job object.
STORE_CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "GPUGEEK_CHECKPOINT_TOKEN",
)


def checkpoint_secret_values(job: Job) -> dict[str, str]:
    """The checkpoint store's credentials for the job's Secret (none for a folder store)."""
    env = _checkpoint_env(job)
    return {name: env[name] for name in STORE_CREDENTIALS if name in env}


def resume_annotations(job: Job) -> dict[str, str]:
    """The pod annotations a resumed start reads GPUGEEK_RESUMED and GPUGEEK_RESUME_FROM
    from (patched onto a suspended Job's template when it resumes)."""
    return {
        RESUMED_ANNOTATION: "1",
        RESUME_FROM_ANNOTATION: _checkpoint_env(job)["GPUGEEK_RESUME_FROM"],
    }


def _env(job: Job, tier: str, offset: int, *, gang: bool = False) -> list[dict]:
    index_path = f"metadata.annotations['{COMPLETION_INDEX}']"
    checkpoint_env = _checkpoint_env(job)
    del checkpoint_env["GPUGEEK_RESUME_FROM"]  # from the annotation, as GPUGEEK_RESUMED
    platform: list[dict] = [
        {"name": "GPUGEEK_JOB_ID", "value": str(job.pk)},
        {"name": "GPUGEEK_ATTEMPT", "value": str(job.attempt)},
        _field_env("GPUGEEK_RESUMED", f"metadata.annotations['{RESUMED_ANNOTATION}']"),
        _field_env("GPUGEEK_RESUME_FROM", f"metadata.annotations['{RESUME_FROM_ANNOTATION}']"),
        *(
            {"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name(job), "key": name}}}
            if name in STORE_CREDENTIALS
            else {"name": name, "value": value}
            for name, value in checkpoint_env.items()
        ),
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
    volumes: list[VolumeMount] | None = None,
    avoid_nodes: Collection[str] = (),
) -> dict:
    """One tier's Indexed Job of the job's current attempt. `pull_secrets`: names of the
    image pull Secrets for its image's registry (see `registry_secret_manifest`).
    `volumes`: the job's volumes, mounted from their claims (`volume_claim_manifest`).
    `avoid_nodes`: nodes its pods must not land on (suspect: jobs.repair).
    `kueue_queue`: the tenant's LocalQueue when Kueue admits jobs; `gang`: the Job is a
    template inside the attempt's JobSet (which carries the queue label instead)."""
    pool = job.spot_pool if tier == SPOT else job.pool
    claim_volumes, claim_mounts = pod_volumes(volumes or [], published_for=job)
    labels = job_labels(job, tier)
    job_metadata_labels = dict(labels)
    if kueue_queue and not gang:
        job_metadata_labels[KUEUE_QUEUE_LABEL] = kueue_queue
        job_metadata_labels[KUEUE_PRIORITY_LABEL] = priority_class_name(job)

    node_selector = {REGION_LABEL: job.region.slug}
    if job.gpu_type_id:
        node_selector[job.gpu_type.node_label_key] = job.gpu_type.node_label_value
    if pool is not None:
        node_selector.update({str(k): str(v) for k, v in (pool.node_selector or {}).items()})
        if job.topology_block:  # admission placed the gang in one block (jobs.services.topology)
            node_selector[pool.topology_label] = job.topology_block

    resources: dict[str, str] = {"cpu": str(job.cpus)}
    memory = _memory_limit(job, pool)
    if memory:
        resources["memory"] = memory
    if job.gpu_type_id and job.gpus_per_node:
        resources[job.gpu_type.resource_name] = str(job.gpus_per_node)
    # Bounded scratch space: a job that fills the node's disk is evicted, not the node.
    resources["ephemeral-storage"] = str(setting("KUBERNETES_EPHEMERAL_STORAGE", "20Gi"))

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
            *claim_mounts,
        ],
    }
    if job.image_id and job.image.tenant_id is not None:
        # A private image is pulled (with the tenant's login) every time: with the default
        # policy a node that cached it would run it for any tenant naming the reference.
        container["imagePullPolicy"] = "Always"
    if job.ports:  # e.g. Jupyter or SSH, reachable through the job's Service
        container["ports"] = [
            {"name": p["name"], "containerPort": p["port"], "protocol": "TCP"} for p in job.ports
        ]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": priority_class_name(job),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.JOB_TERMINATION_GRACE_SECONDS,
        "nodeSelector": node_selector,
        "affinity": _node_affinity(tier, sorted(avoid_nodes)),
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
            *claim_volumes,
        ],
    }
    if pool is not None and pool.runtime_class_name:  # an isolated runtime, set by staff
        pod_spec["runtimeClassName"] = pool.runtime_class_name
    if needs_service(job):  # the pods' DNS names under the job's Service
        pod_spec["subdomain"] = service_name(job)
    tolerations = _tolerations(job, tier)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    # The tenant's own login for the image's registry first, then any cluster-wide ones.
    pull_secret_names = list(pull_secrets or [])
    pull_secret_names += [
        name
        for name in setting("KUBERNETES_IMAGE_PULL_SECRETS", []) or []
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
                    RESUME_FROM_ANNOTATION: _checkpoint_env(job)["GPUGEEK_RESUME_FROM"],
                    RANK_OFFSET_ANNOTATION: str(offset),
                },
            },
            "spec": pod_spec,
        },
    }
    if job.auto_release and not gang:  # a JobSet's Jobs go with the JobSet
        spec["ttlSecondsAfterFinished"] = int(
            setting("KUBERNETES_TTL_SECONDS_AFTER_FINISHED", 3600)
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
    volumes: list[VolumeMount] | None = None,
    avoid_nodes: Collection[str] = (),
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
            volumes=volumes,
            avoid_nodes=avoid_nodes,
        )
        for tier, nodes, offset in tiers(job)
    ]


def jobset_manifest(
    job: Job,
    *,
    kueue_queue: str,
    resumed: bool = False,
    pull_secrets: list[str] | None = None,
    volumes: list[VolumeMount] | None = None,
    avoid_nodes: Collection[str] = (),
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
            volumes=volumes,
            avoid_nodes=avoid_nodes,
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
            setting("KUBERNETES_TTL_SECONDS_AFTER_FINISHED", 3600)
        )
    return {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": jobset_name(job),
            "namespace": namespace_name(job.tenant_id),
            "labels": {
                **job_labels(job),
                KUEUE_QUEUE_LABEL: kueue_queue,
                KUEUE_PRIORITY_LABEL: priority_class_name(job),
            },
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
            "labels": {**managed_labels(), TENANT_LABEL: str(tenant_id)},
        },
        "spec": {"clusterQueue": cluster_queue},
    }


def priority_class_manifests() -> list[dict]:
    """GpuGeek's PriorityClasses (cluster-scoped, the same in every installation).
    `preemptionPolicy: Never`: the scheduler orders pending pods by them and evicts lower
    ones first under node pressure, but never preempts running pods to place a job;
    preemption is the console's admission's (or Kueue's) decision, which keeps other
    organisations' on-demand work safe."""
    return [
        {
            "apiVersion": f"{SCHEDULING_GROUP}/{SCHEDULING_VERSION}",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": {MANAGED_BY: MANAGER}},
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "Never",
            "description": f"GpuGeek jobs of {priority} priority.",
        }
        for priority, (name, value) in PRIORITY_CLASSES.items()
    ]


def workload_priority_class_manifests() -> list[dict]:
    """The same priorities as Kueue WorkloadPriorityClasses (when Kueue admits our jobs):
    Kueue orders and preempts Workloads by these, named by each Job's
    `kueue.x-k8s.io/priority-class` label."""
    return [
        {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name, "labels": {MANAGED_BY: MANAGER}},
            "value": value,
            "description": f"GpuGeek jobs of {priority} priority.",
        }
        for priority, (name, value) in PRIORITY_CLASSES.items()
    ]
