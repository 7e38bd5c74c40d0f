"""GPU replicas: a service names a GPU type and GPUs per replica; it runs on a pool of that
type on the region's cluster, within the organisation's GPU quotas, and may scale on GPU
utilisation (the cluster's autoscaler). Every refusal names its field. (On the sandbox
cluster: tests/services/test_kubernetes.py; metering: test_metering.py.)"""

from __future__ import annotations

import pytest

from marketplace.models import GpuType, NodePool, TenantQuota
from services import services
from services.models import Service

BODY = {
    "name": "llm",
    "image": "pytorch-2-5-cuda12-4",
    "command": ["python", "-m", "server"],
    "port": 8000,
    "region": "us-west",
    "gpu_type": "h100-80gb",
    "min_replicas": 1,
    "max_replicas": 4,
}


def test_a_gpu_service_runs_on_a_pool_of_its_type_and_its_gpus_are_a_revision(owner_api, catalog):
    answer = owner_api.post("/api/v1/services", BODY, format="json")
    assert answer.status_code == 201, answer.json()
    created = answer.json()
    assert (created["gpu_type"], created["gpus_per_replica"]) == ("h100-80gb", 1)
    service = Service.objects.get(pk=created["id"])
    assert service.pool.gpu_type.slug == "h100-80gb" and service.pool.backend == "kubernetes"
    assert service.current_revision.gpus_per_replica == 1
    url = f"/api/v1/services/{service.pk}"
    answer = owner_api.patch(url, {"gpus_per_replica": 2}, format="json")
    assert answer.status_code == 200 and answer.json()["revision"] == 2
    revisions = owner_api.get(f"{url}/revisions").json()
    rows = revisions["results"] if isinstance(revisions, dict) else revisions
    assert [(r["number"], r["gpus_per_replica"]) for r in rows] == [(2, 2), (1, 1)]
    answer = owner_api.patch(url, {"gpu_type": "a100-80gb"}, format="json")
    assert answer.status_code == 400 and "fixed at creation" in str(answer.json()["gpu_type"])
    # GPU utilisation is the cluster's autoscaler's, from one replica up.
    answer = owner_api.patch(url, {"autoscale": {"metric": "gpu", "target": 70}}, format="json")
    assert answer.status_code == 200 and answer.json()["autoscale"]["metric"] == "gpu"
    answer = owner_api.post(f"{url}/scale", {"min_replicas": 0, "max_replicas": 2})
    assert answer.status_code == 400 and "can't scale to zero" in str(answer.json())
    # A CPU service has none.
    cpu = owner_api.post(
        "/api/v1/services",
        {**BODY, "name": "cpu", "gpu_type": None, "image": "python-3.11"},
        format="json",
    )
    assert cpu.status_code == 201, cpu.json()
    assert (cpu.json()["gpu_type"], cpu.json()["gpus_per_replica"]) == (None, 0)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"gpus_per_replica": 9}, "gpus_per_replica", "1 to 8 GPUs per replica"),
        ({"gpu_type": None, "gpus_per_replica": 2}, "gpus_per_replica", "Name the GPU type"),
        ({"gpu_type": "tpu-v9"}, "gpu_type", "no GPU type “tpu-v9”"),
        ({"gpu_type": 7}, "gpu_type", "valid string"),
        ({"region": "nowhere"}, "region", "no region"),
        (
            {"gpu_type": None, "image": "python-3.11", "autoscale": {"metric": "gpu"}},
            "autoscale_metric",
            "needs GPU replicas",
        ),
        ({"min_replicas": 0, "autoscale": {"metric": "gpu"}}, "min_replicas", "scale to zero"),
        ({"autoscale": {"metric": "gpu", "target": 150}}, "autoscale_target", "1 to 100"),
    ],
)
def test_bad_gpu_input_is_a_400_on_the_field(owner_api, catalog, change, field, words):
    answer = owner_api.post("/api/v1/services", {**BODY, **change}, format="json")
    assert answer.status_code == 400, answer.json()
    assert field in answer.json() and words in str(answer.json())
    assert not Service.objects.exists()


def test_a_region_without_the_type_on_a_cluster_says_so(owner_api, catalog):
    missing = GpuType.objects.exclude(
        pk__in=NodePool.objects.filter(region__slug="us-west", gpu_type__isnull=False).values(
            "gpu_type"
        )
    ).first()
    answer = owner_api.post("/api/v1/services", {**BODY, "gpu_type": missing.slug})
    assert answer.status_code == 400 and "has no" in str(answer.json())
    # A type only on the console's host: GPU replicas need a cluster.
    NodePool.objects.filter(region__slug="us-west", gpu_type__slug="h100-80gb").update(
        on_console_host=True
    )
    answer = owner_api.post("/api/v1/services", BODY, format="json")
    assert answer.status_code == 400 and "run on a Kubernetes cluster" in str(answer.json())


def test_the_replicas_gpus_stay_within_the_quotas(world, owner_api, catalog):
    h100 = GpuType.objects.get(slug="h100-80gb")
    TenantQuota.objects.create(tenant=world.tenant, gpu_type=h100, max_gpus=6)
    answer = owner_api.post(
        "/api/v1/services", {**BODY, "gpus_per_replica": 2, "max_replicas": 4}, format="json"
    )
    assert answer.status_code == 400 and "max_replicas" in answer.json()
    assert "8 GPUs, over your organisation's quota of 6" in str(answer.json())
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=services.ServiceSpec(
            **{**BODY, "gpus_per_replica": 2, "max_replicas": 3, "min_replicas": 0}
        ),
    )
    with pytest.raises(services.ServiceError, match="quota of 6"):
        services.service_scale(service=service, user=world.owner, min_replicas=0, max_replicas=4)
    with pytest.raises(services.ServiceError, match="quota of 6"):
        services.service_update(service=service, user=world.owner, changes={"gpus_per_replica": 3})
    # Tenant-wide quotas count every type.
    TenantQuota.objects.create(tenant=world.tenant, gpu_type=None, max_gpus=4)
    with pytest.raises(services.ServiceError, match="quota of 4 GPUs"):
        services.service_update(service=service, user=world.owner, changes={"max_replicas": 3})
