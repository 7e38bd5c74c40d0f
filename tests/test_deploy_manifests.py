"""Issue 17, "Deploying the console": the image definition and the Kubernetes manifests in
deploy/. Every manifest is validated against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict: unknown fields fail), as listed in kustomization.yaml and as
`kubectl kustomize` renders them where kubectl is installed; then what the schemas can't
say: beat is a singleton, every pod runs as non-root with resources, the web pods have
their probes and disruption budget, and the names the objects refer to exist.
tests/jobs/test_kubernetes_rbac.py checks the RBAC rules against the backend's calls."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from jobs.backends.kubernetes import manifests

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.33.0"


def kustomization() -> dict:
    return yaml.safe_load((KUBE / "kustomization.yaml").read_text())


def documents() -> list[tuple[str, dict]]:
    found = []
    for name in kustomization()["resources"]:
        for document in yaml.safe_load_all((KUBE / name).read_text()):
            if document:
                found.append((name, document))
    return found


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for _, d in documents() if d["kind"] == kind}


def pod_specs() -> dict[str, dict]:
    specs = {}
    for _, document in documents():
        if document["kind"] in ("Deployment", "Job"):
            specs[document["metadata"]["name"]] = document["spec"]["template"]["spec"]
    return specs


def validate(document: dict) -> None:
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as error:
        pytest.skip(f"kubernetes-validate has no offline schema for this object: {error}")


def test_the_kustomization_lists_every_manifest():
    listed = set(kustomization()["resources"])
    present = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


@pytest.mark.parametrize("name", kustomization()["resources"])
def test_each_manifest_validates_against_the_kubernetes_schemas(name):
    for document in yaml.safe_load_all((KUBE / name).read_text()):
        if document:
            validate(document)


def test_the_schemas_catch_a_mistake():
    broken = by_kind("Deployment")["gpugeek-web"]
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    unknown = by_kind("Service")["gpugeek-web"]
    unknown["spec"]["selectr"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, KUBERNETES_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_kustomize_rendering_validates():
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60
    )
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert len(objects) == len(documents())
    for document in objects:
        validate(document)
        if document["kind"] not in (
            "Namespace",
            "PriorityClass",
            "ClusterRole",
            "ClusterRoleBinding",
        ):
            assert document["metadata"]["namespace"] == "gpugeek", document["metadata"]
    images = {
        c["image"]
        for d in objects
        if d["kind"] in ("Deployment", "Job")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example.com/gpugeek/console:0.1.0"}


def test_beat_is_a_singleton_and_the_watcher_never_doubles():
    deployments = by_kind("Deployment")
    for name in ("gpugeek-beat", "gpugeek-watcher"):
        assert deployments[name]["spec"]["replicas"] == 1
        assert deployments[name]["spec"]["strategy"] == {"type": "Recreate"}


def test_every_pod_is_non_root_has_resources_and_runs_an_image_command():
    commands = set(re.findall(r"^  ([\w-]+)\)$", (DEPLOY / "entrypoint.sh").read_text(), re.M))
    assert {"web", "worker", "beat", "watcher", "migrate", "ssh-gateway"} <= commands
    priority = set(by_kind("PriorityClass"))
    for name, spec in pod_specs().items():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] != 0, name
        assert spec["priorityClassName"] in priority, name
        for container in spec["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], name
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
            assert "memory" in container["resources"]["limits"], name
            assert set(container["args"][:1]) <= commands, name


def test_only_the_pods_that_call_the_cluster_get_its_service_account():
    accounts = set(by_kind("ServiceAccount"))
    specs = pod_specs()
    # The web process reads and follows job logs from the backend (jobs/logs/), so it
    # calls the cluster too, as the SSH gateway does to find an environment's pod; beat
    # only queues tasks and migrate only touches the database.
    for name in ("gpugeek-worker", "gpugeek-watcher", "gpugeek-web", "gpugeek-ssh-gateway"):
        assert specs[name]["serviceAccountName"] in accounts
    for name in ("gpugeek-beat", "gpugeek-migrate"):
        assert "serviceAccountName" not in specs[name]
        assert specs[name]["automountServiceAccountToken"] is False
    (binding,) = by_kind("ClusterRoleBinding").values()
    assert binding["roleRef"]["name"] in by_kind("ClusterRole")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpugeek-console", "namespace": "gpugeek"}
    ]
    assert kustomization()["namespace"] == "gpugeek"


def test_web_probes_service_ingress_and_disruption_budget():
    web = by_kind("Deployment")["gpugeek-web"]
    (container,) = web["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    labels = web["spec"]["template"]["metadata"]["labels"]
    (budget,) = by_kind("PodDisruptionBudget").values()
    assert budget["spec"]["selector"]["matchLabels"] == labels
    assert budget["spec"]["minAvailable"] < web["spec"]["replicas"]
    service = by_kind("Service")["gpugeek-web"]
    assert service["spec"]["selector"] == labels
    ingress = by_kind("Ingress")["gpugeek-web"]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == "gpugeek-web"


def test_the_config_names_only_settings_that_exist():
    """A misspelt key would be ignored silently: each is read by console/settings.py,
    the entrypoint or prometheus-client."""
    read = set(
        re.findall(r'env_\w+\(\s*"([A-Z0-9_]+)"', (ROOT / "console/settings.py").read_text())
    )
    read |= set(
        re.findall(
            r'_required_in_production\("([A-Z0-9_]+)"', (ROOT / "console/settings.py").read_text()
        )
    )
    read |= set(re.findall(r"\$\{?([A-Z_]+)", (DEPLOY / "entrypoint.sh").read_text()))
    read |= {"PROMETHEUS_MULTIPROC_DIR", "KUBECONFIG"}
    config = by_kind("ConfigMap")["gpugeek-config"]["data"]
    secret = by_kind("Secret")["gpugeek-secrets"]["stringData"]
    assert set(config) - read == set()
    assert set(secret) - read == set()
    for name, spec in pod_specs().items():
        for container in spec["containers"]:
            refs = {r.get("configMapRef", r.get("secretRef"))["name"] for r in container["envFrom"]}
            assert refs == {"gpugeek-config", "gpugeek-secrets"}, name


def test_the_dockerfile_is_slim_non_root_locked_and_collects_static():
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages[-1] == "python:3.11-slim"
    assert re.search(r"^RUN pip install .*-r requirements\.lock$", text, re.M)
    assert "collectstatic --noinput" in text
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    assert not user.startswith(("0", "root"))
    assert 'ENTRYPOINT ["/app/deploy/entrypoint.sh"]' in text
    assert (DEPLOY / "Dockerfile.dockerignore").read_text().count(".venv")
    checked = subprocess.run(["sh", "-n", str(DEPLOY / "entrypoint.sh")], capture_output=True)
    assert checked.returncode == 0, checked.stderr


def test_the_console_outranks_every_job_priority_class():
    """Tenant work never preempts (or is kept before) the control plane; the classes the
    console creates are valid objects too."""
    console = min(c["value"] for c in by_kind("PriorityClass").values())
    jobs = [c["value"] for c in manifests.priority_class_manifests()]
    assert max(jobs) < console
    for document in manifests.priority_class_manifests():
        validate(document)


def test_the_gateways_pods_are_the_ones_workloads_admit():
    """A job's ports (an environment's sshd, its Jupyter) and a service's port admit the
    console's pods by these labels, in this namespace (jobs' gateway_peer)."""
    peer = manifests.gateway_peer()
    components = set(peer["podSelector"]["matchExpressions"][0]["values"])
    namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    assert namespace == kustomization()["namespace"]
    deployments = by_kind("Deployment")
    for name in ("gpugeek-web", "gpugeek-ssh-gateway"):
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert peer["podSelector"]["matchLabels"].items() <= labels.items(), name
        assert labels["app.kubernetes.io/component"] in components, name
    gateway = deployments["gpugeek-ssh-gateway"]["spec"]["template"]["spec"]
    (container,) = gateway["containers"]
    assert container["args"] == ["ssh-gateway"]
    service = by_kind("Service")["gpugeek-ssh-gateway"]
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ports"] == [{"name": "ssh", "port": 22, "targetPort": "ssh"}]
    # The host key every replica shows laptops: one Secret, where the gateway reads it.
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/app/var/ssh-gateway" and mount["readOnly"] is True
    (volume,) = gateway["volumes"]
    assert volume["secret"]["secretName"] == "gpugeek-ssh-gateway"
