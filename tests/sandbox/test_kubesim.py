"""Tests of the Kubernetes simulator (sandbox.kubesim), driven only through the official
kubernetes client."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from sandbox.kubesim import KubeAPIServer, PodRun

NS = "gg-t-42"
H100 = "NVIDIA-H100-80GB-HBM3"
PRODUCT = "nvidia.com/gpu.product"
DEFAULT_NS = "default"
BOX = {"name": "c", "image": "busybox:1"}


@pytest.fixture
def apis(kube_api):
    api = kube_api.api_client()
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    return core, batch


def gpu_job(
    name: str,
    *,
    parallelism: int = 2,
    gpus: str = "8",
    product: str = H100,
    suspend: bool | None = None,
    fail_on_disruption: bool = False,
) -> client.V1Job:
    policy = None
    if fail_on_disruption:
        policy = client.V1PodFailurePolicy(
            rules=[
                client.V1PodFailurePolicyRule(
                    action="FailJob",
                    on_pod_conditions=[
                        client.V1PodFailurePolicyOnPodConditionsPattern(
                            type="DisruptionTarget", status="True"
                        )
                    ],
                )
            ]
        )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={"gpugeek.io/attempt": name}),
        spec=client.V1JobSpec(
            completion_mode="Indexed",
            completions=parallelism,
            parallelism=parallelism,
            backoff_limit=0,
            suspend=suspend,
            pod_failure_policy=policy,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"gpugeek.io/attempt": name}),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    node_selector={PRODUCT: product},
                    containers=[
                        client.V1Container(
                            name="main",
                            image="nvcr.io/nvidia/pytorch:24.05-py3",
                            resources=client.V1ResourceRequirements(
                                limits={"nvidia.com/gpu": gpus}
                            ),
                        )
                    ],
                ),
            ),
        ),
    )


def job_pods(core: client.CoreV1Api, job: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(NS, label_selector=f"job-name={job}").items


def test_namespace_resource_quota_and_kubeconfig(kube_api, tmp_path):
    api = config.new_client_from_config(config_file=str(kube_api.kubeconfig_path(tmp_path)))
    core = client.CoreV1Api(api)
    ns = core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=NS, labels={"gpugeek.io/t": "42"}))
    )
    assert ns.metadata.uid and int(ns.metadata.resource_version) > 0
    assert ns.metadata.creation_timestamp is not None
    assert ns.status.phase == "Active"
    quota = core.create_namespaced_resource_quota(
        NS,
        client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name="gpu-quota"),
            spec=client.V1ResourceQuotaSpec(hard={"requests.nvidia.com/gpu": "8", "pods": "10"}),
        ),
    )
    assert quota.metadata.namespace == NS
    assert int(quota.metadata.resource_version) > int(ns.metadata.resource_version)
    got = core.read_namespaced_resource_quota("gpu-quota", NS)
    assert got.status.hard == {"requests.nvidia.com/gpu": "8", "pods": "10"}
    assert got.status.used == {"requests.nvidia.com/gpu": "0", "pods": "0"}
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_resource_quota("missing", NS)
    assert exc.value.status == 404
    assert json.loads(exc.value.body)["reason"] == "NotFound"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_secret("no-such-ns", client.V1Secret(metadata={"name": "s"}))
    assert exc.value.status == 404
    api.close()


def test_list_nodes_with_label_and_field_selectors(kube_api):
    kube_api.add_node("h100-a", labels={PRODUCT: H100, "gpugeek.io/pool": "spot"})
    kube_api.add_node("h100-b", labels={PRODUCT: H100, "gpugeek.io/pool": "on-demand"})
    kube_api.add_node("a100-a", labels={PRODUCT: "NVIDIA-A100-SXM4-80GB"})
    kube_api.add_node("cpu-a", allocatable={"cpu": "32", "memory": "128Gi"})
    core = client.CoreV1Api(kube_api.api_client())

    def names(**kw) -> list[str]:
        return [n.metadata.name for n in core.list_node(**kw).items]

    assert names() == ["a100-a", "cpu-a", "h100-a", "h100-b"]
    assert names(label_selector=f"{PRODUCT}={H100}") == ["h100-a", "h100-b"]
    assert names(label_selector=f"{PRODUCT}!={H100}") == ["a100-a", "cpu-a"]
    assert names(label_selector="gpugeek.io/pool in (spot,reserved)") == ["h100-a"]
    assert names(label_selector=PRODUCT) == ["a100-a", "h100-a", "h100-b"]
    assert names(label_selector=f"{PRODUCT},gpugeek.io/pool notin (spot)") == [
        "a100-a",
        "h100-b",
    ]
    assert names(field_selector="metadata.name=h100-b") == ["h100-b"]
    listed = core.list_node(limit=3)
    assert len(listed.items) == 3 and listed.metadata.remaining_item_count == 1
    rest = core.list_node(limit=3, _continue=listed.metadata._continue)
    assert [n.metadata.name for n in rest.items] == ["h100-b"]
    node = core.read_node("h100-a")
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    with pytest.raises(ApiException) as exc:
        core.list_node(label_selector="a in (b")
    assert exc.value.status == 400


def test_indexed_job_runs_on_matching_node_and_completes(kube_api, apis):
    core, batch = apis
    kube_api.add_node("a100-a", labels={PRODUCT: "NVIDIA-A100-SXM4-80GB"})
    kube_api.add_node("h100-a", labels={PRODUCT: H100}, allocatable={"nvidia.com/gpu": "16"})
    job = batch.create_namespaced_job(NS, gpu_job("train-1"))
    assert job.metadata.uid and job.spec.selector.match_labels == {
        "batch.kubernetes.io/controller-uid": job.metadata.uid
    }
    kube_api.tick()
    pods = sorted(job_pods(core, "train-1"), key=lambda p: p.metadata.name)
    assert [p.status.phase for p in pods] == ["Running", "Running"]
    assert {p.spec.node_name for p in pods} == {"h100-a"}
    for i, pod in enumerate(pods):
        assert pod.metadata.name.startswith(f"train-1-{i}-") and len(pod.metadata.name) == 15
        assert pod.metadata.labels["batch.kubernetes.io/job-completion-index"] == str(i)
        assert pod.metadata.annotations["batch.kubernetes.io/job-completion-index"] == str(i)
        assert pod.metadata.labels["controller-uid"] == job.metadata.uid
        assert pod.metadata.owner_references[0].uid == job.metadata.uid
        assert pod.spec.hostname == f"train-1-{i}"
    status = batch.read_namespaced_job_status("train-1", NS).status
    assert (status.active, status.ready) == (2, 2)

    with pytest.raises(ApiException) as exc:
        batch.create_namespaced_job(NS, gpu_job("train-1"))
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["reason"] == "AlreadyExists"

    for pod in pods:
        kube_api.succeed_pod(NS, pod.metadata.name)
    job = batch.read_namespaced_job("train-1", NS)
    assert job.status.succeeded == 2 and job.status.completed_indexes == "0-1"
    assert {c.type for c in job.status.conditions} >= {"Complete", "SuccessCriteriaMet"}


def test_unschedulable_pod_stays_pending_with_event(kube_api, apis):
    core, batch = apis
    kube_api.add_node("h100-a", labels={PRODUCT: H100})
    batch.create_namespaced_job(NS, gpu_job("big", parallelism=1, gpus="16"))
    kube_api.tick()
    (pod,) = job_pods(core, "big")
    assert pod.status.phase == "Pending" and pod.spec.node_name is None
    cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in cond.message
    events = core.list_namespaced_event(
        NS, field_selector=f"involvedObject.name={pod.metadata.name},reason=FailedScheduling"
    ).items
    assert len(events) == 1 and events[0].type == "Warning"


def test_suspend_via_patch_deletes_pods_and_resume_recreates(kube_api, apis):
    core, batch = apis
    kube_api.add_node("h100-a", labels={PRODUCT: H100}, allocatable={"nvidia.com/gpu": "16"})
    batch.create_namespaced_job(NS, gpu_job("pausable"))
    kube_api.tick()
    assert len(job_pods(core, "pausable")) == 2
    batch.patch_namespaced_job("pausable", NS, {"spec": {"suspend": True}})
    kube_api.tick()
    assert job_pods(core, "pausable") == []
    job = batch.read_namespaced_job("pausable", NS)
    suspended = next(c for c in job.status.conditions if c.type == "Suspended")
    assert suspended.status == "True" and not job.status.active
    batch.patch_namespaced_job("pausable", NS, {"spec": {"suspend": False}})
    kube_api.tick()
    assert [p.status.phase for p in job_pods(core, "pausable")] == ["Running", "Running"]
    job = batch.read_namespaced_job("pausable", NS)
    assert next(c for c in job.status.conditions if c.type == "Suspended").status == "False"


def test_watch_pods_from_resource_version(kube_api, apis):
    core, _ = apis
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="solo", labels={"app": "x"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox:1")]),
    )
    with kube_api.paused():
        core.create_namespaced_pod(NS, pod)
        kube_api.add_node("n1")
        kube_api.tick()
    w = watch.Watch()
    seen = []
    for ev in w.stream(
        core.list_namespaced_pod, NS, label_selector="app=x", resource_version=rv, timeout_seconds=5
    ):
        seen.append((ev["type"], ev["object"].status.phase))
        if ev["object"].status.phase == "Running":
            w.stop()
    assert seen[0] == ("ADDED", "Pending")
    assert seen[-1] == ("MODIFIED", "Running")

    # a live watch receives events as they happen
    got: list[str] = []
    start_rv = core.list_namespaced_pod(NS).metadata.resource_version

    def consume() -> None:
        w2 = watch.Watch()
        for ev in w2.stream(
            core.list_namespaced_pod, NS, resource_version=start_rv, timeout_seconds=5
        ):
            got.append(f"{ev['type']} {ev['object'].metadata.name}")
            if ev["type"] == "DELETED":
                w2.stop()

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.1)
    core.delete_namespaced_pod("solo", NS)
    t.join(timeout=5)
    assert not t.is_alive() and got == ["DELETED solo"]


def test_stale_watch_gets_410(kube_api, apis):
    core, _ = apis
    rv = core.list_namespaced_secret(NS).metadata.resource_version
    for i in range(3):
        core.create_namespaced_secret(
            NS, client.V1Secret(metadata=client.V1ObjectMeta(name=f"s{i}"))
        )
    kube_api.expire_watch_history()
    with pytest.raises(ApiException) as exc:
        for _ in watch.Watch().stream(
            core.list_namespaced_secret, NS, resource_version=rv, timeout_seconds=2
        ):
            pass
    assert exc.value.status == 410
    # without timeout_seconds the client retries once from the same version, then raises
    with pytest.raises(ApiException) as exc:
        for _ in watch.Watch().stream(core.list_namespaced_secret, NS, resource_version=rv):
            pass
    assert exc.value.status == 410
    # the current version is still fine
    fresh = core.list_namespaced_secret(NS).metadata.resource_version
    events = list(
        watch.Watch().stream(
            core.list_namespaced_secret, NS, resource_version=fresh, timeout_seconds=1
        )
    )
    assert events == []


def test_follow_pod_logs(kube_api, apis):
    core, _ = apis
    kube_api.add_node("n1")
    core.create_namespaced_pod(
        NS,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="logger"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox:1")]),
        ),
    )
    kube_api.tick()
    kube_api.append_log(NS, "logger", "epoch 1\nepoch 2\n")
    assert core.read_namespaced_pod_log("logger", NS, tail_lines=1) == "epoch 2\n"
    lines: list[str] = []

    def follow() -> None:
        for line in watch.Watch().stream(core.read_namespaced_pod_log, "logger", NS):
            lines.append(line)

    t = threading.Thread(target=follow)
    t.start()
    time.sleep(0.1)
    kube_api.append_log(NS, "logger", "epoch 3")
    time.sleep(0.1)
    kube_api.append_log(NS, "logger", "epoch 4\n")
    time.sleep(0.1)
    kube_api.succeed_pod(NS, "logger")  # the stream ends when the container ends
    t.join(timeout=5)
    assert not t.is_alive()
    assert lines == ["epoch 1", "epoch 2", "epoch 3", "epoch 4"]


def test_logs_of_a_pending_pod_are_a_400(kube_api, apis):
    core, _ = apis
    core.create_namespaced_pod(
        NS,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="waiting"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox:1")]),
        ),
    )
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("waiting", NS)
    assert exc.value.status == 400 and "waiting to start" in json.loads(exc.value.body)["message"]


def test_fault_injection(kube_api):
    core = client.CoreV1Api(kube_api.api_client())
    kube_api.fail_next("GET", r"^/api/v1/nodes$", status=500)
    with pytest.raises(ApiException) as exc:
        core.list_node()
    assert exc.value.status == 500
    assert json.loads(exc.value.body)["kind"] == "Status"
    assert core.list_node().items == []  # only the next one failed

    kube_api.fail_next("*", r"/namespaces$", status=503, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            core.list_namespace()
        assert exc.value.status == 503
    core.list_namespace()
    # urllib3 itself retries a 429/503 that carries Retry-After: the caller never sees it
    kube_api.fail_next("GET", r"/namespaces$", status=429, retry_after=0)
    core.list_namespace()
    assert [r.path for r in kube_api.requests][-2:] == ["/api/v1/namespaces"] * 2

    kube_api.delay_next("GET", r"^/api/v1/nodes$", seconds=0.6, times=None)
    with pytest.raises(urllib3.exceptions.MaxRetryError):  # urllib3 retries reads 3 times
        core.list_node(_request_timeout=0.1)
    kube_api.clear_faults()
    core.list_node(_request_timeout=2)


def test_evicted_pod_fails_the_job_via_pod_failure_policy(kube_api, apis):
    core, batch = apis
    kube_api.add_node("h100-a", labels={PRODUCT: H100}, allocatable={"nvidia.com/gpu": "16"})
    batch.create_namespaced_job(NS, gpu_job("spot-1", fail_on_disruption=True))
    kube_api.tick()
    victim, other = sorted(p.metadata.name for p in job_pods(core, "spot-1"))
    kube_api.evict_pod(NS, victim, reason="PreemptionByScheduler")
    pod = core.read_namespaced_pod(victim, NS)
    assert pod.status.phase == "Failed"
    target = next(c for c in pod.status.conditions if c.type == "DisruptionTarget")
    assert (target.status, target.reason) == ("True", "PreemptionByScheduler")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 137
    job = batch.read_namespaced_job("spot-1", NS)
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert (failed.status, failed.reason) == ("True", "PodFailurePolicy")
    assert "DisruptionTarget" in failed.message
    assert job.status.failed == 1 and not job.status.active
    with pytest.raises(ApiException):
        core.read_namespaced_pod(other, NS)  # the other rank was terminated


def test_quota_blocks_pod_creation_and_job_reports_it(kube_api, apis):
    core, batch = apis
    kube_api.add_node("h100-a", labels={PRODUCT: H100})
    core.create_namespaced_resource_quota(
        NS,
        client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name="q"),
            spec=client.V1ResourceQuotaSpec(hard={"requests.nvidia.com/gpu": "8"}),
        ),
    )
    batch.create_namespaced_job(NS, gpu_job("greedy", parallelism=2, gpus="8"))
    kube_api.tick()
    assert len(job_pods(core, "greedy")) == 1
    events = core.list_namespaced_event(NS, field_selector="reason=FailedCreate").items
    assert len(events) == 1 and "exceeded quota: q" in events[0].message
    used = core.read_namespaced_resource_quota("q", NS).status.used
    assert used == {"requests.nvidia.com/gpu": "8"}


def test_delete_job_propagation(kube_api, apis):
    core, batch = apis
    kube_api.add_node("h100-a", labels={PRODUCT: H100}, allocatable={"nvidia.com/gpu": "32"})
    batch.create_namespaced_job(NS, gpu_job("bg"))
    batch.create_namespaced_job(NS, gpu_job("orphaning"))
    kube_api.tick()
    batch.delete_namespaced_job("bg", NS, propagation_policy="Background")
    assert job_pods(core, "bg") == []
    batch.delete_namespaced_job("orphaning", NS)  # batch/v1 default: orphan the pods
    assert len(job_pods(core, "orphaning")) == 2
    last_delete = [r for r in kube_api.requests if r.method == "DELETE"][-1]
    assert "propagationPolicy" not in last_delete.query


def test_optimistic_concurrency_and_status_subresource(kube_api, apis):
    core, batch = apis
    cm = core.create_namespaced_config_map(
        NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cfg"), data={"a": "1"})
    )
    cm.data = {"a": "2"}
    core.replace_namespaced_config_map("cfg", NS, cm)
    cm.data = {"a": "3"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_config_map("cfg", NS, cm)  # stale resourceVersion
    assert exc.value.status == 409
    batch.create_namespaced_job(NS, gpu_job("j", suspend=True))
    job = batch.patch_namespaced_job("j", NS, {"status": {"active": 99}})
    assert not job.status.active  # status changes through the main resource are ignored
    with pytest.raises(ApiException) as exc:
        batch.patch_namespaced_job("j", NS, {"spec": {"completionMode": "NonIndexed"}})
    assert exc.value.status == 422


def test_every_stored_object_deserializes_into_the_client_models(kube_api, apis):
    """The client's pydantic models reject missing required fields: check all we emit."""
    core, batch = apis
    kube_api.add_node("h100-a", labels={PRODUCT: H100}, allocatable={"nvidia.com/gpu": "64"})

    def script(pod: dict) -> PodRun | None:
        if pod["metadata"]["labels"]["job-name"] == "crashy":
            return PodRun(duration=0, exit_code=3, logs=["boom"])
        return None

    kube_api.pod_script = script
    core.create_namespaced_service(
        NS,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="rdzv"),
            spec=client.V1ServiceSpec(cluster_ip="None", ports=[client.V1ServicePort(port=29500)]),
        ),
    )
    core.create_namespaced_limit_range(
        NS,
        client.V1LimitRange(
            metadata=client.V1ObjectMeta(name="lr"),
            spec=client.V1LimitRangeSpec(
                limits=[client.V1LimitRangeItem(type="Container", default={"cpu": "1"})]
            ),
        ),
    )
    client.NetworkingV1Api(kube_api.api_client()).create_namespaced_network_policy(
        NS,
        client.V1NetworkPolicy(
            metadata=client.V1ObjectMeta(name="default-deny"),
            spec=client.V1NetworkPolicySpec(
                pod_selector=client.V1LabelSelector(), policy_types=["Ingress", "Egress"]
            ),
        ),
    )
    core.create_namespaced_secret(
        NS, client.V1Secret(metadata=client.V1ObjectMeta(name="s"), string_data={"k": "v"})
    )
    batch.create_namespaced_job(NS, gpu_job("crashy"))
    batch.create_namespaced_job(NS, gpu_job("evicted", fail_on_disruption=True))
    kube_api.tick()
    victim = job_pods(core, "evicted")[0].metadata.name
    core.create_namespaced_pod_eviction(
        victim,
        NS,
        client.V1Eviction(metadata=client.V1ObjectMeta(name=victim, namespace=NS)),
    )
    kube_api.tick()
    assert batch.read_namespaced_job("crashy", NS).status.failed
    evicted = batch.read_namespaced_job("evicted", NS)
    assert [c.reason for c in evicted.status.conditions if c.type == "Failed"] == [
        "PodFailurePolicy"
    ]
    api = client.ApiClient()
    models = {"Event": "CoreV1Event"}
    seen = set()
    for rt in list(kube_api._by_key.values()):
        for obj in kube_api.list(rt.key):
            model = models.get(rt.kind, f"V1{rt.kind}")
            api.deserialize(json.dumps(obj), model, "application/json")
            seen.add(rt.kind)
    assert {"Pod", "Job", "Node", "Event", "Service", "NetworkPolicy"} <= seen


def test_stop_ends_open_streams():
    server = KubeAPIServer(auto_tick=None).start()
    core = client.CoreV1Api(server.api_client())
    done = threading.Event()

    def forever() -> None:
        try:
            for _ in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=60):
                pass
        except Exception:  # the connection may be cut rather than ended
            pass
        done.set()

    t = threading.Thread(target=forever, daemon=True)
    t.start()
    time.sleep(0.2)
    started = time.monotonic()
    server.stop()
    assert done.wait(3)
    assert time.monotonic() - started < 3


def test_spot_taints_deadline_and_ttl(kube_api, apis):
    core, batch = apis
    spot = {"key": "gpugeek.io/spot", "value": "true", "effect": "NoSchedule"}
    kube_api.add_node("spot-1", labels={PRODUCT: H100}, taints=[spot])
    intolerant = gpu_job("intolerant", parallelism=1)
    tolerant = gpu_job("tolerant", parallelism=1)
    tolerant.spec.template.spec.tolerations = [
        client.V1Toleration(key="gpugeek.io/spot", operator="Exists", effect="NoSchedule")
    ]
    tolerant.spec.active_deadline_seconds = 60
    tolerant.spec.ttl_seconds_after_finished = 30
    batch.create_namespaced_job(NS, intolerant)
    batch.create_namespaced_job(NS, tolerant)
    kube_api.tick()
    assert [p.status.phase for p in job_pods(core, "intolerant")] == ["Pending"]
    assert [p.status.phase for p in job_pods(core, "tolerant")] == ["Running"]
    kube_api.advance_clock(61)
    job = batch.read_namespaced_job("tolerant", NS)
    assert [c.reason for c in job.status.conditions if c.type == "Failed"] == ["DeadlineExceeded"]
    kube_api.advance_clock(31)
    with pytest.raises(ApiException) as exc:
        batch.read_namespaced_job("tolerant", NS)
    assert exc.value.status == 404


def solo_pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox:1")]),
    )


def test_the_kubelet_hands_the_script_secret_values_as_a_container_sees_them(kube_api, apis):
    core, _ = apis
    kube_api.add_node("n1")
    core.create_namespaced_secret(
        NS,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="creds"),
            data={"TOKEN": base64.b64encode(b"t0ken").decode()},
            string_data={"KEY": "k3y"},
        ),
    )
    seen: list[dict] = []
    kube_api.pod_script = lambda pod: seen.append(pod) or PodRun(duration=None)
    pod = solo_pod("reader")
    ref = client.V1EnvVarSource
    pod.spec.containers[0].env = [
        client.V1EnvVar(name="PLAIN", value="p"),
        *(
            client.V1EnvVar(
                name=name,
                value_from=ref(secret_key_ref=client.V1SecretKeySelector(name=secret, key=key)),
            )
            for name, secret, key in [
                ("TOKEN", "creds", "TOKEN"),
                ("KEY", "creds", "KEY"),
                ("ABSENT", "creds", "NOPE"),
                ("NO_SECRET", "missing", "TOKEN"),
            ]
        ),
    ]
    core.create_namespaced_pod(NS, pod)
    kube_api.wait_for(lambda: bool(seen))
    env = {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in seen[0]["spec"]["containers"][0]["env"]
    }
    assert env["PLAIN"] == "p" and env["TOKEN"] == "t0ken" and env["KEY"] == "k3y"
    assert "secretKeyRef" in env["ABSENT"] and "secretKeyRef" in env["NO_SECRET"]
    # The stored pod keeps the reference: the value reaches the container only.
    stored = core.read_namespaced_pod("reader", NS).spec.containers[0].env
    assert stored[1].value is None and stored[1].value_from.secret_key_ref.name == "creds"


def test_a_ticker_writes_the_pods_output_while_it_runs(kube_api, apis):
    core, _ = apis
    kube_api.add_node("n1")
    seen: list[float] = []

    def every_ten_seconds() -> Callable[[float], list[str]]:
        written = 0

        def ticker(elapsed: float) -> list[str]:
            nonlocal written
            seen.append(elapsed)
            lines = [f"step {n}" for n in range(written + 1, int(elapsed // 10) + 1)]
            written = max(written, int(elapsed // 10))
            return lines + (["done"] if elapsed >= 30 else [])

        return ticker

    kube_api.pod_script = lambda pod: PodRun(
        duration=30, logs=["start"], ticker=every_ten_seconds()
    )
    core.create_namespaced_pod(NS, solo_pod("trainer"))

    def log() -> str:
        return core.read_namespaced_pod_log("trainer", NS)

    kube_api.wait_for(lambda: core.read_namespaced_pod("trainer", NS).status.phase == "Running")
    assert log() == "start\n"
    kube_api.advance_clock(10)
    kube_api.wait_for(lambda: "step 1" in log())
    assert core.read_namespaced_pod("trainer", NS).status.phase == "Running"
    kube_api.advance_clock(25)  # past its end: the ticker is called at 30 s, then it ends
    kube_api.wait_for(lambda: core.read_namespaced_pod("trainer", NS).status.phase == "Succeeded")
    assert log() == "start\nstep 1\nstep 2\nstep 3\ndone\n"
    assert seen == sorted(seen) and seen[-1] == 30  # never past the pod's duration


def test_a_ticker_runs_outside_the_lock_and_a_broken_one_is_reported():
    server = KubeAPIServer(auto_tick=None).start()
    core = client.CoreV1Api(server.api_client())
    server.add_node("n1")
    reads: list[dict | None] = []

    def reads_the_server(elapsed: float) -> list[str]:
        # another thread can use the server meanwhile: the store lock is not held
        reader = threading.Thread(target=lambda: reads.append(server.get("pods", DEFAULT_NS, "p")))
        reader.start()
        reader.join(timeout=2)
        return ["read"]

    def broken(elapsed: float) -> list[str]:
        raise RuntimeError("ticker bug")

    runs = {"p": PodRun(ticker=reads_the_server), "q": PodRun(duration=5, ticker=broken)}
    server.pod_script = lambda pod: runs[pod["metadata"]["name"]]
    try:
        for name in runs:
            server.create(
                "pods", {"metadata": {"name": name}, "spec": {"containers": [BOX]}}, DEFAULT_NS
            )
        server.tick()  # starts both
        server.tick()  # runs their tickers
        assert len(reads) == 1 and reads[0] is not None
        assert core.read_namespaced_pod_log("p", DEFAULT_NS) == "read\n"
        assert len(server.errors) == 1 and "ticker bug" in server.errors[0]
        server.advance_clock(5)  # the broken ticker was dropped: the pod still ends on time
        assert server.get("pods", DEFAULT_NS, "q")["status"]["phase"] == "Succeeded"
        server.tick()
        assert len(server.errors) == 1
    finally:
        server.stop()


def test_fail_fraction_and_slow_fraction_for_a_while(kube_api):
    core = client.CoreV1Api(kube_api.api_client())
    kube_api.fail_fraction(0.5, seconds=30, status=500, path_regex=r"/namespaces$")
    failed = 0
    for _ in range(100):
        try:
            core.list_namespace()
        except ApiException as exc:
            assert exc.status == 500 and json.loads(exc.body)["kind"] == "Status"
            failed += 1
    assert 20 <= failed <= 80
    core.list_node()  # other paths are not affected
    kube_api.clear_faults()
    core.list_namespace()

    kube_api.fail_fraction(1.0, seconds=1, status=503, method="GET")
    with pytest.raises(ApiException) as exc:
        core.list_node()
    assert exc.value.status == 503
    with pytest.raises(ApiException):  # a watch is affected when it connects
        next(iter(watch.Watch().stream(core.list_namespaced_pod, DEFAULT_NS, timeout_seconds=1)))
    time.sleep(1.05)
    core.list_node()  # the window has passed

    kube_api.slow_fraction(1.0, seconds=30, delay=0.6, path_regex=r"^/api/v1/nodes$")
    started = time.monotonic()
    core.list_namespace()
    assert time.monotonic() - started < 0.5
    core.list_node()
    assert time.monotonic() - started >= 0.6
    kube_api.clear_faults()
    started = time.monotonic()
    core.list_node()
    assert time.monotonic() - started < 0.5
    with pytest.raises(ValueError):
        kube_api.fail_fraction(1.5, seconds=1)


def test_extra_routes_answer_beside_the_kubernetes_api():
    server = KubeAPIServer(auto_tick=None, token="s3cret").start()
    calls: list[tuple] = []

    def prometheus(method, path, query, body, headers):
        calls.append((method, path, query, body, headers.get("Authorization")))
        return 200, {"status": "success", "data": {"result": []}}, "application/json"

    def control(method, path, query, body, headers):
        return 202, f"{method} {path} {body.decode()}", "text/plain"

    try:
        server.add_route("/prometheus/", prometheus)
        server.add_route("/sandbox/", control)
        server.add_route("/sandbox/v1/special", lambda *args: (200, "special", "text/plain"))
        server.fail_next("*", ".*", status=500, times=None)  # routes are not subject to faults
        http = urllib3.PoolManager()
        got = http.request("GET", f"{server.url}/prometheus/api/v1/query?query=up")
        assert got.status == 200 and got.headers["Content-Type"] == "application/json"
        assert json.loads(got.data) == {"status": "success", "data": {"result": []}}
        assert calls == [("GET", "/prometheus/api/v1/query", {"query": "up"}, b"", None)]
        got = http.request("POST", f"{server.url}/sandbox/v1/reclaim", body=b'{"n": 1}')
        assert (got.status, got.data) == (202, b'POST /sandbox/v1/reclaim {"n": 1}')
        assert got.headers["Content-Type"] == "text/plain"
        assert http.request("GET", f"{server.url}/sandbox/v1/special/x").data == b"special"
        assert list(server.requests) == []  # not Kubernetes requests
        server.clear_faults()
        assert http.request("GET", f"{server.url}/api/v1/nodes").status == 401  # needs the token
        with pytest.raises(ValueError):
            server.add_route("prometheus", prometheus)
    finally:
        server.stop()


def test_a_server_can_listen_on_a_given_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = KubeAPIServer(auto_tick=None, port=port).start()
    try:
        assert server.port == port and server.url == f"http://127.0.0.1:{port}"
        assert client.CoreV1Api(server.api_client()).list_namespace().items
    finally:
        server.stop()
