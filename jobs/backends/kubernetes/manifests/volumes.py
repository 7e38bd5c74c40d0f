"""Volumes on Kubernetes: a PersistentVolumeClaim per volume in the tenant's namespace
(`gg-vol-<volume id>`, created at a job's dispatch, 409 = it exists), mounted in the
job's pods by claim name. The access mode follows the volume's access: a single-writer
volume is ReadWriteOnce, a shared one ReadWriteMany (ReadOnlyMany where every mount of
it is read-only does not change the claim: a claim's modes are fixed at creation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.backends.base import PUBLISHED_MOUNT
from jobs.backends.kubernetes.manifests.names import (
    ATTEMPT_LABEL,
    RUN_AS,
    TENANT_LABEL,
    managed_labels,
    namespace_name,
    owner_labels,
    published_name,
    setting,
)
from jobs.extensions import VolumeMount

if TYPE_CHECKING:
    from jobs.models import Job

VOLUME_LABEL = "gpugeek.io/volume"


def volume_claim_name(volume_id: int) -> str:
    return f"gg-vol-{int(volume_id)}"


def volume_claim_manifest(tenant_id: int, mount: VolumeMount) -> dict:
    spec: dict = {
        "accessModes": ["ReadWriteMany" if mount.shared else "ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{int(mount.size_gib)}Gi"}},
    }
    storage_class = setting("VOLUME_STORAGE_CLASS", "")
    if storage_class:  # else the cluster's default class
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": volume_claim_name(mount.volume_id),
            "namespace": namespace_name(tenant_id),
            "labels": {
                **managed_labels(),
                TENANT_LABEL: str(tenant_id),
                VOLUME_LABEL: str(mount.volume_id),
            },
        },
        "spec": spec,
    }


def published_manifest(job: Job, files: dict[str, str]) -> dict:
    """The files the console publishes to the job while it runs (publish_file), as a
    ConfigMap its pods mount read-only at PUBLISHED_MOUNT. The mount is optional, so the
    ConfigMap is made only once there is something to publish; the kubelet brings a change
    into the running pods within its sync period (about a minute), each file whole."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": published_name(job),
            "namespace": namespace_name(job.tenant_id),
            "labels": owner_labels(job),
        },
        "data": dict(files),
    }


def pod_volumes(
    mounts: list[VolumeMount], *, published_for: Job | None = None
) -> tuple[list[dict], list[dict]]:
    """(pod volumes, container volumeMounts) of the job's volumes, after the ConfigMap of
    the files published to `published_for` (`published_manifest`) where given."""
    volumes: list[dict] = []
    volume_mounts: list[dict] = []
    if published_for is not None:
        config_map = {"name": published_name(published_for), "optional": True}
        volumes.append({"name": "published", "configMap": config_map})
        volume_mounts.append({"name": "published", "mountPath": PUBLISHED_MOUNT, "readOnly": True})
    for position, mount in enumerate(mounts):
        name = f"vol-{position}"
        volumes.append(
            {
                "name": name,
                "persistentVolumeClaim": {
                    "claimName": volume_claim_name(mount.volume_id),
                    "readOnly": mount.read_only,
                },
            }
        )
        volume_mounts.append({"name": name, "mountPath": mount.path, "readOnly": mount.read_only})
    return volumes, volume_mounts


# --- Filling a volume: a Job that copies into its claim -----------------------------------

FILL_LABEL = "gpugeek.io/volume-fill"
# Where the copy pod mounts the claim (storage.fill_pod's default target).
FILL_MOUNT = "/volume"
# A copy that runs longer than this is stopped by the cluster (the console says so).
FILL_DEADLINE_SECONDS = 24 * 3600


def volume_fill_name(fill_id: int, attempt: int) -> str:
    """The fill run's Job and Secret: one per run, so a rerun never meets the old one."""
    return f"gg-fill-{int(fill_id)}-{int(attempt)}"


def _fill_labels(tenant_id: int, volume_id: int, fill_id: int) -> dict[str, str]:
    return {
        **managed_labels(),
        TENANT_LABEL: str(tenant_id),
        VOLUME_LABEL: str(volume_id),
        FILL_LABEL: str(fill_id),
    }


def volume_fill_secret_manifest(
    *, tenant_id: int, volume_id: int, fill_id: int, attempt: int, credential: str
) -> dict:
    """The source's credential (an organisation secret's value) for the copy pod."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": volume_fill_name(fill_id, attempt),
            "namespace": namespace_name(tenant_id),
            "labels": _fill_labels(tenant_id, volume_id, fill_id),
        },
        "type": "Opaque",
        "stringData": {"GPUGEEK_FILL_CREDENTIAL": credential},
    }


def volume_fill_job_manifest(
    *,
    tenant_id: int,
    mount: VolumeMount,
    fill_id: int,
    attempt: int,
    source: str,
    endpoint: str,
    with_credential: bool,
) -> dict:
    """The copy: the console's image running `python -m storage.fill_pod` with the
    volume's claim mounted read-write, no retries (the console decides on reruns), under
    the same Pod Security settings as a job's pods."""
    name = volume_fill_name(fill_id, attempt)
    env = [
        {"name": "GPUGEEK_FILL_SOURCE", "value": source},
        {"name": "GPUGEEK_FILL_ENDPOINT", "value": endpoint},
        {"name": "GPUGEEK_FILL_ID", "value": str(int(fill_id))},
        {"name": "GPUGEEK_FILL_ATTEMPT", "value": str(int(attempt))},
        {"name": "GPUGEEK_FILL_SIZE_GIB", "value": str(int(mount.size_gib))},
        {"name": "GPUGEEK_FILL_TARGET", "value": FILL_MOUNT},
        {
            "name": "GPUGEEK_FILL_ALLOW_PRIVATE_HOSTS",
            "value": "1" if setting("VOLUME_FILL_ALLOW_PRIVATE_HOSTS", False) else "0",
        },
        {"name": "GPUGEEK_FILL_S3_REGION", "value": setting("VOLUME_FILL_S3_REGION", "")},
    ]
    if with_credential:
        env.append(
            {
                "name": "GPUGEEK_FILL_CREDENTIAL",
                "valueFrom": {"secretKeyRef": {"name": name, "key": "GPUGEEK_FILL_CREDENTIAL"}},
            }
        )
    labels = _fill_labels(tenant_id, mount.volume_id, fill_id)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace_name(tenant_id), "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": FILL_DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": {**labels, ATTEMPT_LABEL: str(int(attempt))}},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS,
                        "runAsGroup": RUN_AS,
                        "fsGroup": RUN_AS,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "copy",
                            "image": setting("VOLUME_FILL_IMAGE", "gpugeek-console"),
                            "command": ["python", "-m", "storage.fill_pod"],
                            "env": env,
                            "resources": {
                                "requests": {"cpu": "250m", "memory": "256Mi"},
                                "limits": {"cpu": "1", "memory": "1Gi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                                "runAsNonRoot": True,
                            },
                            "volumeMounts": [{"name": "volume", "mountPath": FILL_MOUNT}],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "volume",
                            "persistentVolumeClaim": {
                                "claimName": volume_claim_name(mount.volume_id)
                            },
                        }
                    ],
                },
            },
        },
    }
