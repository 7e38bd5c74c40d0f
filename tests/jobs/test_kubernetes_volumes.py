"""Volumes on Kubernetes: a PersistentVolumeClaim per volume in the tenant namespace,
created at dispatch (409 = it exists), bound by the sandbox's API server, mounted in the
job's pods; golden manifests; deleting the volume deletes its claim."""

from __future__ import annotations

import pytest
from kubernetes import client

from jobs import services, tasks
from jobs.actors import SYSTEM
from jobs.backends.kubernetes import manifests
from jobs.extensions import VolumeMount
from jobs.models import JobStatus
from storage import services as storage
from tests.factories import VolumeFactory
from tests.jobs.test_kubernetes_lifecycle import (  # noqa: F401  (cluster: a fixture)
    cluster,
    gpu_spec,
    live_pods,
    ns,
    settle,
)
from tests.jobs.test_kubernetes_manifests import (  # noqa: F401
    assert_golden,
    cpu_job,
    pinned_settings,
)
from tests.jobs_helpers import launch

MOUNTS = [
    VolumeMount(volume_id=5, name="data", path="/data", read_only=False, size_gib=100,
                shared=False),
    VolumeMount(volume_id=6, name="weights", path="/weights", read_only=True, size_gib=20,
                shared=True),
]  # fmt: skip


def test_claims_and_mounts_match_golden(settings):
    settings.VOLUME_STORAGE_CLASS = "fast-ssd"
    assert_golden(
        "kubernetes_cpu_job_volumes.json",
        {
            "claims": [manifests.volume_claim_manifest(7, mount) for mount in MOUNTS],
            "jobs": manifests.job_manifests(cpu_job(), volumes=MOUNTS),
        },
    )


def test_claims_and_jobs_with_volumes_are_real_api_objects():
    api = client.ApiClient()
    for claim in (manifests.volume_claim_manifest(7, mount) for mount in MOUNTS):
        model = client.V1PersistentVolumeClaim.from_dict(claim)
        assert api.sanitize_for_serialization(model) == claim
    (job,) = manifests.job_manifests(cpu_job(), volumes=MOUNTS)
    assert api.sanitize_for_serialization(client.V1Job.from_dict(job)) == job


def test_the_default_storage_class_is_the_clusters(settings):
    settings.VOLUME_STORAGE_CLASS = ""
    claim = manifests.volume_claim_manifest(7, MOUNTS[0])
    assert "storageClassName" not in claim["spec"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"


@pytest.mark.django_db
def test_a_job_mounts_its_volume_claim_bound_by_the_cluster(
    world,
    cluster,  # noqa: F811
    settings,
    django_capture_on_commit_callbacks,
):
    settings.VOLUME_STORAGE_CLASS = "standard-rwo"
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=50, region__slug="us-west")
    shared = VolumeFactory(
        tenant=world.tenant, name="ref", size_gib=5, access="shared", region__slug="us-west"
    )
    mounts = [{"name": "data", "path": "/data"}, {"name": "ref", "path": "/ref", "read_only": True}]
    job = settle(cluster, launch(world, gpu_spec(gpus_per_node=4, volumes=mounts)),
                 JobStatus.RUNNING)  # fmt: skip
    claim = cluster.get("persistentvolumeclaims", ns(job), f"gg-vol-{volume.pk}")
    assert claim["status"]["phase"] == "Bound"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["storageClassName"] == "standard-rwo"
    assert claim["status"]["capacity"] == {"storage": "50Gi"}
    shared_claim = cluster.get("persistentvolumeclaims", ns(job), f"gg-vol-{shared.pk}")
    assert shared_claim["spec"]["accessModes"] == ["ReadWriteMany"]
    (pod,) = live_pods(cluster, job)
    claims = {
        v["persistentVolumeClaim"]["claimName"]: v["persistentVolumeClaim"]["readOnly"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims == {f"gg-vol-{volume.pk}": False, f"gg-vol-{shared.pk}": True}
    paths = {
        m["mountPath"]: m.get("readOnly") for m in pod["spec"]["containers"][0]["volumeMounts"]
    }
    assert paths["/data"] is False and paths["/ref"] is True

    # A second job mounting the shared volume reuses its claim (409 = it exists).
    second = launch(world, gpu_spec(gpus_per_node=4, volumes=[{"name": "ref", "path": "/ref"}]))
    assert second.status in (JobStatus.PROVISIONING, JobStatus.RUNNING)
    uid = shared_claim["metadata"]["uid"]
    assert (
        cluster.get("persistentvolumeclaims", ns(job), f"gg-vol-{shared.pk}")["metadata"]["uid"]
        == uid
    )

    # Growing the volume grows its claim (volume expansion).
    with django_capture_on_commit_callbacks(execute=True):
        storage.volume_resize(volume=volume, user=world.owner, size_gib=80)
    grown = cluster.get("persistentvolumeclaims", ns(job), f"gg-vol-{volume.pk}")
    assert grown["spec"]["resources"]["requests"]["storage"] == "80Gi"
    assert grown["status"]["capacity"] == {"storage": "80Gi"}

    # Deleting a volume (once no job holds it) deletes its claim.
    services.job_cancel(job=job, actor=SYSTEM)
    tasks.job_cancel_task(job.pk)
    job = settle(cluster, job, JobStatus.CANCELLED)
    with django_capture_on_commit_callbacks(execute=True):
        storage.volume_delete(volume=volume, user=world.owner)
    assert cluster.get("persistentvolumeclaims", ns(job), f"gg-vol-{volume.pk}") is None
