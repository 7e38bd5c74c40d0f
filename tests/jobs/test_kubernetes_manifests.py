"""Golden tests of the Kubernetes objects built for a job (no cluster, no database).

The JSON files under tests/jobs/golden/ are the reviewed output; after an intended change
regenerate them with `GOLDEN_UPDATE=1 pytest tests/jobs/test_kubernetes_manifests.py`
and review the diff.
"""

from __future__ import annotations

import base64
import json
import os
from decimal import Decimal
from pathlib import Path

import pytest
from kubernetes import client

from jobs.backends.kubernetes import manifests
from jobs.models import Job
from marketplace.models import GpuType, NodePool, Region, TenantQuota

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(autouse=True)
def pinned_settings(settings):
    settings.JOB_TERMINATION_GRACE_SECONDS = 30
    settings.KUBERNETES_TTL_SECONDS_AFTER_FINISHED = 3600
    settings.KUBERNETES_EGRESS_DENY_CIDRS = list(manifests.DEFAULT_EGRESS_DENY_CIDRS)
    settings.KUBERNETES_IMAGE_PULL_SECRETS = []
    settings.KUBERNETES_EPHEMERAL_STORAGE = "20Gi"
    settings.GPUGEEK_INSTALLATION_ID = "gg-golden"
    settings.CHECKPOINT_STORE_URL = "file:///var/lib/gpugeek-checkpoints"
    return settings


def h100_job() -> Job:
    """2 nodes × 8 H100, spot ratio 0.5: one on-demand rank, one spot rank."""
    region = Region(pk=1, slug="us-west", name="US West")
    gpu = GpuType(
        pk=3,
        slug="h100-80gb",
        vendor="nvidia",
        model="H100 80GB SXM",
        node_label_key="nvidia.com/gpu.product",
        node_label_value="NVIDIA-H100-80GB-HBM3",
        resource_name="nvidia.com/gpu",
    )
    pool = NodePool(
        pk=10,
        slug="kubernetes-us-west-h100-80gb-on-demand",
        region=region,
        backend="kubernetes",
        tier="on_demand",
        gpu_type=gpu,
        gpus_per_node=8,
        vcpus_per_node=96,
        memory_gib_per_node=1024,
    )
    spot_pool = NodePool(
        pk=11,
        slug="kubernetes-us-west-h100-80gb-spot",
        region=region,
        backend="kubernetes",
        tier="spot",
        gpu_type=gpu,
        gpus_per_node=8,
        vcpus_per_node=96,
        memory_gib_per_node=1024,
        node_selector={"gpugeek.io/pool": "h100-spot"},
    )
    return Job(
        pk=4242,
        tenant_id=7,
        name="llama finetune",
        image_reference="nvcr.io/nvidia/pytorch:24.05-py3",
        command=["torchrun", "--nnodes=2", "train.py", "--note", "$(id); rm -rf /"],
        env={"EPOCHS": "3", "MASTER_PORT": "1"},
        secret_env_names=["HF_TOKEN"],
        gpu_type=gpu,
        gpus_per_node=8,
        cpus=32,
        nodes=2,
        region=region,
        spot_ratio=Decimal("0.5"),
        max_runtime_minutes=120,
        checkpoint_path="s3://acme-checkpoints/llama",
        auto_release=True,
        backend="kubernetes",
        pool=pool,
        spot_pool=spot_pool,
        spot_nodes=1,
        on_demand_nodes=1,
        attempt=1,
    )


def cpu_job() -> Job:
    region = Region(pk=2, slug="us-east", name="US East")
    pool = NodePool(
        pk=20,
        slug="kubernetes-us-east-cpu-on-demand",
        region=region,
        backend="kubernetes",
        tier="on_demand",
        vcpus_per_node=96,
        memory_gib_per_node=384,
    )
    return Job(
        pk=77,
        tenant_id=7,
        name="preprocess",
        image_reference="docker.io/library/python:3.11-slim",
        command=["python", "-m", "prep", "--shards", "16"],
        env={},
        cpus=4,
        nodes=1,
        region=region,
        max_runtime_minutes=30,
        auto_release=False,
        backend="kubernetes",
        pool=pool,
        on_demand_nodes=1,
        attempt=2,
    )


def rendered(
    job: Job,
    *,
    secrets: dict[str, str] | None = None,
    registry_login: tuple[str, str, str] | None = None,
) -> dict:
    quotas = [TenantQuota(tenant_id=7, gpu_type=None, max_gpus=16, max_concurrent_jobs=4)]
    pull_secrets = []
    out = {
        "namespace": manifests.namespace_manifests(7, quotas, {"nvidia.com/gpu": [3]}),
        "service": manifests.service_manifest(job),
    }
    if registry_login is not None:
        out["pull_secret"] = manifests.registry_secret_manifest(7, *registry_login)
        pull_secrets.append(out["pull_secret"]["metadata"]["name"])
    out["jobs"] = manifests.job_manifests(job, pull_secrets=pull_secrets)
    if secrets is not None:
        out["secret"] = manifests.secret_manifest(job, secrets)
    return out


def assert_golden(name: str, value: dict) -> None:
    path = GOLDEN / name
    text = json.dumps(value, indent=2, sort_keys=True) + "\n"
    if os.environ.get("GOLDEN_UPDATE"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with GOLDEN_UPDATE=1"
    assert json.loads(path.read_text()) == json.loads(text), (
        f"{name} differs from the golden file; if intended, regenerate with GOLDEN_UPDATE=1"
    )


def test_h100_spot_mix_matches_golden():
    assert_golden(
        "kubernetes_h100_2node_spot.json",
        rendered(
            h100_job(),
            secrets={"HF_TOKEN": "hf_x"},
            registry_login=("nvcr.io", "$oauthtoken", "nvapi-x"),
        ),
    )


def test_cpu_job_matches_golden():
    assert_golden("kubernetes_cpu_job.json", rendered(cpu_job()))


@pytest.mark.parametrize("job_factory", [h100_job, cpu_job])
def test_every_field_is_a_real_api_field(job_factory):
    """A typo'd key would be dropped by a real API server: round-trip through the official
    client's models and lose nothing."""
    api = client.ApiClient()
    job = job_factory()
    models = {
        "Namespace": client.V1Namespace,
        "ResourceQuota": client.V1ResourceQuota,
        "LimitRange": client.V1LimitRange,
        "NetworkPolicy": client.V1NetworkPolicy,
        "Service": client.V1Service,
        "Secret": client.V1Secret,
        "Job": client.V1Job,
    }
    objects = [
        *manifests.namespace_manifests(7, [], {}),
        manifests.service_manifest(job),
        manifests.secret_manifest(job, {"A": "b"}),
        manifests.registry_secret_manifest(7, "ghcr.io", "bot", "ghp_x"),
        *manifests.job_manifests(job, pull_secrets=["gg-pull-ghcr.io-0000"]),
    ]
    for obj in objects:
        model = models[obj["kind"]].from_dict(obj)
        assert api.sanitize_for_serialization(model) == obj, obj["kind"]


def env_of(kube_job: dict) -> dict[str, dict]:
    container = kube_job["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, dict] = {}
    for entry in container["env"]:
        env[entry["name"]] = entry  # the last entry of a name is the one that counts
    return env


def test_tiers_ranks_and_rendezvous():
    on_demand, spot = manifests.job_manifests(h100_job())
    assert on_demand["metadata"]["name"] == "gg-4242-a1"
    assert spot["metadata"]["name"] == "gg-4242-a1-spot"
    for kube_job in (on_demand, spot):
        spec = kube_job["spec"]
        assert spec["completionMode"] == "Indexed"
        assert spec["completions"] == spec["parallelism"] == 1
        assert spec["template"]["spec"]["subdomain"] == "gg-4242"
        env = env_of(kube_job)
        assert env["MASTER_ADDR"]["value"] == "gg-4242-a1-0.gg-4242"
        assert env["WORLD_SIZE"]["value"] == "2"
        assert env["MASTER_PORT"]["value"] == "29500"  # the user's MASTER_PORT is overridden
        names = [e["name"] for e in spec["template"]["spec"]["containers"][0]["env"]]
        assert len(names) == len(set(names))
    assert env_of(on_demand)["GPUGEEK_RANK_OFFSET"]["value"] == "0"
    assert "NODE_RANK" in env_of(on_demand)
    assert env_of(spot)["GPUGEEK_RANK_OFFSET"]["value"] == "1"
    assert "NODE_RANK" not in env_of(spot)  # index + offset: computed by the entrypoint
    spot_spec = spot["spec"]["template"]["spec"]
    assert {t["key"] for t in spot_spec["tolerations"]} >= {"gpugeek.io/spot"}
    assert spot_spec["nodeSelector"]["gpugeek.io/pool"] == "h100-spot"
    assert not any(
        t["key"] == "gpugeek.io/spot"
        for t in on_demand["spec"]["template"]["spec"].get("tolerations", [])
    )


def test_command_is_argv_and_secrets_are_references():
    kube_job = manifests.job_manifests(h100_job())[0]
    container = kube_job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-1] == "$(id); rm -rf /"
    assert "args" not in container
    assert env_of(kube_job)["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "gg-4242-env", "key": "HF_TOKEN"}},
    }
    assert "hf_" not in json.dumps(kube_job)


def test_all_spot_job_uses_the_spot_job_as_rank_zero():
    job = h100_job()
    job.on_demand_nodes, job.spot_nodes, job.pool = 0, 2, None
    (spot,) = manifests.job_manifests(job)
    assert spot["metadata"]["name"] == "gg-4242-a1-spot"
    assert env_of(spot)["MASTER_ADDR"]["value"] == "gg-4242-a1-spot-0.gg-4242"
    assert env_of(spot)["GPUGEEK_RANK_OFFSET"]["value"] == "0"
    assert "NODE_RANK" in env_of(spot)


def test_kueue_pull_secrets_and_egress_settings(settings):
    settings.KUBERNETES_IMAGE_PULL_SECRETS = ["registry-creds"]
    settings.KUBERNETES_EGRESS_DENY_CIDRS = ["169.254.169.254/32", "10.20.0.0/16"]
    assert (
        "kueue.x-k8s.io/queue-name"
        not in (manifests.job_manifests(cpu_job())[0]["metadata"]["labels"])
    )
    kube_job = manifests.job_manifests(cpu_job(), kueue_queue="gpu-queue")[0]
    assert kube_job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert kube_job["spec"]["suspend"] is True  # Kueue admits by unsuspending
    assert kube_job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert "ttlSecondsAfterFinished" not in kube_job["spec"]  # auto_release off
    policy = manifests.network_policy_manifest(7)
    internet = policy["spec"]["egress"][-1]["to"]
    assert internet[0]["ipBlock"] == {
        "cidr": "0.0.0.0/0",
        "except": ["169.254.169.254/32", "10.20.0.0/16"],
    }
    assert internet[1]["ipBlock"] == {"cidr": "::/0"}


def test_registry_pull_secret_is_a_docker_config_for_that_registry():
    secret = manifests.registry_secret_manifest(7, "registry.example.com:5000", "bot", "s3cret")
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"]["namespace"] == "gg-t-7"
    name = secret["metadata"]["name"]
    assert name == manifests.registry_secret_name("registry.example.com:5000")
    assert name.startswith("gg-pull-registry.example.com-5000-")
    assert manifests.registry_secret_name("registry.example.com-5000") != name
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert config["auths"]["registry.example.com:5000"] == {
        "username": "bot",
        "password": "s3cret",
        "auth": base64.b64encode(b"bot:s3cret").decode(),
    }
    hub = manifests.registry_secret_manifest(7, "docker.io", "bot", "x")
    hub_config = json.loads(base64.b64decode(hub["data"][".dockerconfigjson"]))
    assert list(hub_config["auths"]) == ["https://index.docker.io/v1/"]


def test_pull_secrets_name_the_registry_login_then_the_cluster_wide_ones(settings):
    settings.KUBERNETES_IMAGE_PULL_SECRETS = ["cluster-wide", "gg-pull-x"]
    for kube_job in manifests.job_manifests(h100_job(), pull_secrets=["gg-pull-x"]):
        assert kube_job["spec"]["template"]["spec"]["imagePullSecrets"] == [
            {"name": "gg-pull-x"},
            {"name": "cluster-wide"},
        ]
    settings.KUBERNETES_IMAGE_PULL_SECRETS = []
    pod_spec = manifests.job_manifests(cpu_job())[0]["spec"]["template"]["spec"]
    assert "imagePullSecrets" not in pod_spec


def test_split_job_under_kueue_is_one_jobset_golden():
    """Gang admission: both tiers in one JobSet (one Kueue Workload, admitted together)."""
    job = h100_job()
    jobset = manifests.jobset_manifest(job, kueue_queue="gpugeek", pull_secrets=["gg-pull-x"])
    assert_golden(
        "kubernetes_h100_2node_spot_kueue.json",
        {
            "local_queue": manifests.local_queue_manifest(7, "gpugeek", "gpu-cluster-queue"),
            "jobset": jobset,
        },
    )
    assert jobset["metadata"]["name"] == "gg-4242-a1"
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpugeek"
    assert jobset["spec"]["suspend"] is True
    on_demand, spot = jobset["spec"]["replicatedJobs"]
    assert (on_demand["name"], spot["name"]) == ("od", "spot")
    for replicated in (on_demand, spot):
        assert replicated["replicas"] == 1
        template = replicated["template"]
        assert "suspend" not in template["spec"]  # the JobSet's suspend decides
        assert "kueue.x-k8s.io/queue-name" not in template["metadata"]["labels"]
        env = {e["name"]: e for e in template["spec"]["template"]["spec"]["containers"][0]["env"]}
        # The JobSet names its Jobs <jobset>-<replicatedJob>-0; rank 0 is od's index 0.
        assert env["MASTER_ADDR"]["value"] == "gg-4242-a1-od-0-0.gg-4242"
        # The headless Service stays ours: pods keep its subdomain.
        assert template["spec"]["template"]["spec"]["subdomain"] == "gg-4242"
    assert on_demand["template"]["metadata"]["labels"]["gpugeek.io/tier"] == "on_demand"
    assert spot["template"]["metadata"]["labels"]["gpugeek.io/tier"] == "spot"
    assert manifests.job_name(job, "spot", gang=True) == "gg-4242-a1-spot-0"
    assert manifests.is_gang(job, "gpugeek") and not manifests.is_gang(job, None)
    assert not manifests.is_gang(cpu_job(), "gpugeek")  # one tier: a plain Job


def test_quota_from_per_type_quotas():
    quotas = [
        TenantQuota(tenant_id=7, gpu_type_id=3, max_gpus=8),
        TenantQuota(tenant_id=7, gpu_type_id=4, max_gpus=4),
        TenantQuota(tenant_id=7, gpu_type_id=None, max_concurrent_jobs=2),
    ]
    hard = manifests.quota_hard(quotas, {"nvidia.com/gpu": [3, 4], "amd.com/gpu": [5]})
    # every NVIDIA type has a quota: their sum; AMD has none: left to admission
    assert hard == {"requests.nvidia.com/gpu": "12", "count/jobs.batch": "4"}


@pytest.mark.parametrize(
    ("priority", "class_name"),
    [("low", "gpugeek-low"), ("normal", "gpugeek-normal"), ("critical", "gpugeek-critical")],
)
def test_a_jobs_priority_reaches_its_pods_and_kueue(priority, class_name):
    job = cpu_job()
    job.priority = priority
    (plain,) = manifests.job_manifests(job)
    assert plain["spec"]["template"]["spec"]["priorityClassName"] == class_name
    assert "kueue.x-k8s.io/priority-class" not in plain["metadata"]["labels"]
    (queued,) = manifests.job_manifests(job, kueue_queue="gpugeek")
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == class_name
    gang = h100_job()
    gang.priority = priority
    jobset = manifests.jobset_manifest(gang, kueue_queue="gpugeek")
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == class_name
    for replicated in jobset["spec"]["replicatedJobs"]:
        assert replicated["template"]["spec"]["template"]["spec"]["priorityClassName"] == (
            class_name
        )


def test_priority_classes_rank_like_the_console_and_never_preempt_on_their_own():
    classes = {c["metadata"]["name"]: c for c in manifests.priority_class_manifests()}
    values = [classes[f"gpugeek-{p}"]["value"] for p in ("low", "normal", "critical")]
    assert values == sorted(values) and len(set(values)) == 3
    # Preemption is admission's decision (other organisations' on-demand work is safe).
    assert {c["preemptionPolicy"] for c in classes.values()} == {"Never"}
    assert all(c["globalDefault"] is False for c in classes.values())
    kueue = {
        c["metadata"]["name"]: c["value"] for c in manifests.workload_priority_class_manifests()
    }
    assert kueue == {name: c["value"] for name, c in classes.items()}


def test_a_pools_isolated_runtime_reaches_its_pods_only():
    job = h100_job()
    job.spot_pool.runtime_class_name = "kata"
    on_demand, spot = manifests.job_manifests(job)
    assert spot["spec"]["template"]["spec"]["runtimeClassName"] == "kata"
    assert "runtimeClassName" not in on_demand["spec"]["template"]["spec"]
    # The Pod Security settings stay as they are under another runtime.
    pod = spot["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
