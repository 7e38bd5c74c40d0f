"""Volumes on Kubernetes: a PersistentVolumeClaim per volume in the tenant's namespace
(`gg-vol-<volume id>`, created at a job's dispatch, 409 = it exists), mounted in the
job's pods by claim name. The access mode follows the volume's access: a single-writer
volume is ReadWriteOnce, a shared one ReadWriteMany (ReadOnlyMany where every mount of
it is read-only does not change the claim: a claim's modes are fixed at creation)."""

from __future__ import annotations

from jobs.backends.kubernetes.manifests.names import (
    TENANT_LABEL,
    managed_labels,
    namespace_name,
    setting,
)
from jobs.extensions import VolumeMount

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


def pod_volumes(mounts: list[VolumeMount]) -> tuple[list[dict], list[dict]]:
    """(pod volumes, container volumeMounts) of the job's volumes."""
    volumes, volume_mounts = [], []
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
