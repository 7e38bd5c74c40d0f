"""Kubernetes objects for a job, built as plain dicts (no API calls, no database writes).

Everything the cluster runs is derived here from the Job row's structured, validated
fields, so the same job always yields the same objects (golden-tested in
tests/jobs/test_kubernetes_manifests.py). Object names are deterministic, which is what
makes `KubernetesBackend.submit` idempotent (409 AlreadyExists means "done already").

Layout of one job (`DESIGN.md`, "Kubernetes, precisely"):

- the tenant's namespace `gg-t-<tenant>` with Pod Security "restricted", a
  ResourceQuota from the tenant's quota, a LimitRange and a default-deny NetworkPolicy;
- a headless Service `gg-<job>` for rendezvous, shared by every attempt and tier, made
  only for a job on more than one node or with ports (`needs_service`): a lone pod's
  rank 0 is itself (MASTER_ADDR=localhost);
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

from jobs.backends.kubernetes.manifests.names import (
    ATTEMPT_LABEL,
    COMPLETION_INDEX,
    CONTAINER,
    DEFAULT_EGRESS_DENY_CIDRS,
    HOME,
    INSTALLATION_LABEL,
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
    ON_DEMAND,
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
    TIER_LABEL,
    gateway_peer,
    installation_id,
    is_gang,
    job_labels,
    job_name,
    jobset_name,
    managed_labels,
    managed_selector,
    master_addr,
    namespace_name,
    needs_service,
    owner_labels,
    priority_class_name,
    published_name,
    registry_secret_name,
    secret_name,
    service_name,
    setting,
    tiers,
)
from jobs.backends.kubernetes.manifests.namespace import (
    limit_range_manifest,
    namespace_manifest,
    namespace_manifests,
    network_policy_manifest,
    quota_hard,
    resource_quota_manifest,
)
from jobs.backends.kubernetes.manifests.volumes import (
    FILL_LABEL,
    VOLUME_LABEL,
    pod_volumes,
    published_manifest,
    volume_claim_manifest,
    volume_claim_name,
    volume_fill_job_manifest,
    volume_fill_name,
    volume_fill_secret_manifest,
)
from jobs.backends.kubernetes.manifests.workload import (
    DOCKER_HUB_AUTH_KEY,
    checkpoint_secret_values,
    job_manifest,
    job_manifests,
    jobset_manifest,
    local_queue_manifest,
    ports_policy_manifest,
    priority_class_manifests,
    registry_secret_manifest,
    resume_annotations,
    secret_manifest,
    service_manifest,
    workload_priority_class_manifests,
)

__all__ = [
    "ATTEMPT_LABEL",
    "COMPLETION_INDEX",
    "CONTAINER",
    "DEFAULT_EGRESS_DENY_CIDRS",
    "DOCKER_HUB_AUTH_KEY",
    "FILL_LABEL",
    "HOME",
    "INSTALLATION_LABEL",
    "JOBSET_GROUP",
    "JOBSET_TIER_NAMES",
    "JOBSET_VERSION",
    "JOB_LABEL",
    "KUEUE_GROUP",
    "KUEUE_PRIORITY_LABEL",
    "KUEUE_QUEUE_LABEL",
    "KUEUE_VERSION",
    "MANAGED_BY",
    "MANAGER",
    "MASTER_PORT",
    "ON_DEMAND",
    "PRIORITY_CLASSES",
    "RANK_OFFSET_ANNOTATION",
    "REGION_LABEL",
    "REGISTRY_ANNOTATION",
    "RESUMED_ANNOTATION",
    "RESUME_FROM_ANNOTATION",
    "RUN_AS",
    "SCHEDULING_GROUP",
    "SCHEDULING_VERSION",
    "SPOT",
    "SPOT_NODE_LABELS",
    "SPOT_TOLERATION_KEYS",
    "TENANT_LABEL",
    "TIER_LABEL",
    "VOLUME_LABEL",
    "checkpoint_secret_values",
    "gateway_peer",
    "installation_id",
    "is_gang",
    "job_labels",
    "job_manifest",
    "job_manifests",
    "job_name",
    "jobset_manifest",
    "jobset_name",
    "limit_range_manifest",
    "local_queue_manifest",
    "managed_labels",
    "managed_selector",
    "master_addr",
    "namespace_manifest",
    "namespace_manifests",
    "namespace_name",
    "needs_service",
    "network_policy_manifest",
    "owner_labels",
    "pod_volumes",
    "ports_policy_manifest",
    "priority_class_manifests",
    "priority_class_name",
    "published_manifest",
    "published_name",
    "quota_hard",
    "registry_secret_manifest",
    "registry_secret_name",
    "resource_quota_manifest",
    "resume_annotations",
    "secret_manifest",
    "secret_name",
    "service_manifest",
    "service_name",
    "setting",
    "tiers",
    "volume_claim_manifest",
    "volume_claim_name",
    "volume_fill_job_manifest",
    "volume_fill_name",
    "volume_fill_secret_manifest",
    "workload_priority_class_manifests",
]
