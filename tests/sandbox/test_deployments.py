"""Deployments, ReplicaSets, serving pods and Endpoints of the Kubernetes simulator,
driven through the official kubernetes client; the pods are reached over real HTTP at
their podIP and port."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from sandbox.kubesim import KubeAPIServer
from sandbox.kubesim.serving import LOOPBACK

NS = "svc-t"
PORT = 8000


@pytest.fixture
def apis(kube_api):
    api = kube_api.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    kube_api.add_node("node-a")
    return core, apps


def deployment(
    name: str,
    *,
    replicas: int = 2,
    image: str = "server:1",
    ready_after: float = 0.0,
    probe: bool = False,
    strategy: client.V1DeploymentStrategy | None = None,
    selector: dict[str, str] | None = None,
    pre_stop_sleep: int | None = None,
) -> client.V1Deployment:
    readiness = None
    if probe:
        readiness = client.V1Probe(
            http_get=client.V1HTTPGetAction(path="/healthz", port=PORT), period_seconds=1
        )
    container = client.V1Container(
        name="server",
        image=image,
        ports=[client.V1ContainerPort(container_port=PORT, name="http")],
        env=[client.V1EnvVar(name="SANDBOX_READY_AFTER_SECONDS", value=str(ready_after))],
        readiness_probe=readiness,
        resources=client.V1ResourceRequirements(requests={"cpu": "100m", "memory": "64Mi"}),
    )
    if pre_stop_sleep is not None:
        sleep = client.V1SleepAction(seconds=pre_stop_sleep)
        container.lifecycle = client.V1Lifecycle(pre_stop=client.V1LifecycleHandler(sleep=sleep))
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=selector or {"app": name}),
            strategy=strategy,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": name}),
                spec=client.V1PodSpec(containers=[container]),
            ),
        ),
    )


def live_pods(core: client.CoreV1Api, app: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(NS, label_selector=f"app={app}").items
    return [p for p in pods if p.status.phase not in ("Succeeded", "Failed")]


def is_ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def get(url: str, data: bytes | None = None) -> tuple[int, bytes]:
    """GET (POST with ``data``) a pod's server: the status and body, errors included."""
    try:
        with urllib.request.urlopen(url, data=data, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_deployment_defaults_validation_and_watch(kube_api, apis):
    _, apps = apis
    with pytest.raises(ApiException) as mismatch:
        apps.create_namespaced_deployment(NS, deployment("web", selector={"app": "other"}))
    assert mismatch.value.status == 422
    assert (
        "`selector` does not match template `labels`" in json.loads(mismatch.value.body)["message"]
    )
    created = apps.create_namespaced_deployment(NS, deployment("web", replicas=0))
    assert created.spec.strategy.type == "RollingUpdate"
    rolling = created.spec.strategy.rolling_update
    assert (rolling.max_surge, rolling.max_unavailable) == ("25%", "25%")
    assert created.spec.revision_history_limit == 10
    with pytest.raises(ApiException) as immutable:
        apps.patch_namespaced_deployment(
            "web", NS, {"spec": {"selector": {"matchLabels": {"app": "web", "tier": "x"}}}}
        )
    assert immutable.value.status == 422 and "field is immutable" in immutable.value.body
    spec = deployment("one").spec.to_dict()
    del spec["replicas"]
    defaulted = apps.create_namespaced_deployment(NS, {"metadata": {"name": "one"}, "spec": spec})
    assert defaulted.spec.replicas == 1
    added = []
    stream = watch.Watch()
    for event in stream.stream(apps.list_namespaced_deployment, NS, timeout_seconds=5):
        added.append((event["type"], event["object"].metadata.name))
        if len(added) == 2:
            stream.stop()
    assert added == [("ADDED", "one"), ("ADDED", "web")]
    assert [d.metadata.name for d in apps.list_deployment_for_all_namespaces().items] == [
        "one",
        "web",
    ]
    with kube_api.paused():  # no status update between the read and the replace
        read = apps.read_namespaced_deployment("web", NS)
        read.spec.replicas = 0
        replaced = apps.replace_namespaced_deployment("web", NS, read)
    assert replaced.metadata.resource_version == read.metadata.resource_version  # a no-op


def test_deployment_pods_serve_http_and_become_ready_after_the_probe(kube_api, apis):
    core, apps = apis
    apps.create_namespaced_deployment(NS, deployment("web", ready_after=2.0, probe=True))
    pods = kube_api.wait_for(
        lambda: [p for p in live_pods(core, "web") if p.status.phase == "Running"] or None
    )
    assert not any(is_ready(p) for p in pods)  # the first probe found it starting
    (rs,) = apps.list_namespaced_replica_set(NS).items
    pod_hash = rs.metadata.labels["pod-template-hash"]
    assert rs.metadata.name == f"web-{pod_hash}"
    assert rs.spec.selector.match_labels == {"app": "web", "pod-template-hash": pod_hash}
    assert rs.metadata.owner_references[0].kind == "Deployment"
    assert rs.metadata.annotations["deployment.kubernetes.io/revision"] == "1"
    for pod in pods:
        assert pod.metadata.name.startswith(f"{rs.metadata.name}-")
        assert len(pod.metadata.name) == len(rs.metadata.name) + 6
        assert pod.metadata.owner_references[0].name == rs.metadata.name
        assert pod.status.pod_ip.startswith("127.0.") and not pod.status.pod_ip.startswith(
            "127.0.0."
        )
        assert pod.spec.node_name == "node-a"
    assert len({p.status.pod_ip for p in pods}) == 2
    first = pods[0]
    status, body = get(f"http://{first.status.pod_ip}:{PORT}/healthz")
    assert (status, body) in ((503, b"starting"), (200, b"ok"))
    kube_api.wait_for(lambda: all(is_ready(p) for p in live_pods(core, "web")), timeout=10)
    status, body = get(f"http://{first.status.pod_ip}:{PORT}/v1/models?x=1")
    assert status == 200
    assert json.loads(body) == {
        "pod": first.metadata.name,
        "path": "/v1/models?x=1",
        "method": "GET",
        "body": "",
    }
    status, body = get(f"http://{first.status.pod_ip}:{PORT}/v1/echo", data=b'{"a": 1}')
    assert json.loads(body)["method"] == "POST" and json.loads(body)["body"] == '{"a": 1}'
    status, body = get(f"http://{first.status.pod_ip}:{PORT}/generate", data=b"{}")
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2, 3, 4]
    unhealthy = core.list_namespaced_event(
        NS, field_selector=f"involvedObject.name={first.metadata.name},reason=Unhealthy"
    ).items
    assert "statuscode: 503" in unhealthy[0].message
    pod = core.read_namespaced_pod(first.metadata.name, NS)
    assert all(s.ready for s in pod.status.container_statuses)
    status_ = apps.read_namespaced_deployment("web", NS).status
    assert (status_.replicas, status_.ready_replicas, status_.available_replicas) == (2, 2, 2)
    assert status_.updated_replicas == 2 and status_.observed_generation == 1
    conditions = {c.type: (c.status, c.reason) for c in status_.conditions}
    assert conditions == {
        "Available": ("True", "MinimumReplicasAvailable"),
        "Progressing": ("True", "NewReplicaSetAvailable"),
    }


def test_scale_by_patch_and_scale_subresource_deletes_unready_pods_first(kube_api, apis):
    core, apps = apis
    apps.create_namespaced_deployment(NS, deployment("web", ready_after=0.1, probe=True))
    kube_api.wait_for(lambda: sum(map(is_ready, live_pods(core, "web"))) == 2, timeout=10)
    ready = {p.metadata.name for p in live_pods(core, "web")}
    with kube_api.paused():
        apps.patch_namespaced_deployment("web", NS, {"spec": {"replicas": 3}})
        kube_api.tick()
        assert len(live_pods(core, "web")) == 3  # the third is not probed yet
        scale = apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 2}})
        assert scale.spec.replicas == 2
        kube_api.tick()
        assert {p.metadata.name for p in live_pods(core, "web")} == ready
    scale = apps.read_namespaced_deployment_scale("web", NS)
    assert scale.status.selector == "app=web" and scale.status.replicas == 2
    apps.replace_namespaced_deployment_scale(
        "web", NS, client.V1Scale(metadata=client.V1ObjectMeta(name="web"), spec={"replicas": 0})
    )
    kube_api.wait_for(lambda: live_pods(core, "web") == [])
    (rs,) = apps.list_namespaced_replica_set(NS).items
    assert rs.spec.replicas == 0 and rs.status.replicas == 0
    assert apps.read_namespaced_deployment("web", NS).metadata.generation == 4


def test_rolling_update_stays_within_surge_and_unavailability(kube_api, apis):
    core, apps = apis
    strategy = client.V1DeploymentStrategy(
        type="RollingUpdate",
        rolling_update=client.V1RollingUpdateDeployment(max_surge=1, max_unavailable=1),
    )
    apps.create_namespaced_deployment(
        NS, deployment("web", replicas=4, ready_after=0.2, probe=True, strategy=strategy)
    )
    kube_api.wait_for(
        lambda: (apps.read_namespaced_deployment("web", NS).status.available_replicas or 0) == 4,
        timeout=15,
    )
    apps.patch_namespaced_deployment(
        "web",
        NS,
        {"spec": {"template": {"spec": {"containers": [{"name": "server", "image": "server:2"}]}}}},
    )
    seen_total, seen_ready = set(), set()
    with kube_api.paused():
        for _ in range(600):
            kube_api.tick()
            pods = live_pods(core, "web")
            seen_total.add(len(pods))
            seen_ready.add(sum(1 for p in pods if is_ready(p)))
            status = apps.read_namespaced_deployment("web", NS).status
            if (status.updated_replicas, status.available_replicas, status.replicas) == (4, 4, 4):
                break
            time.sleep(0.05)
    assert max(seen_total) <= 5 and min(seen_ready) >= 3
    assert 5 in seen_total  # it did surge
    assert {p.spec.containers[0].image for p in live_pods(core, "web")} == {"server:2"}
    replica_sets = sorted(
        apps.list_namespaced_replica_set(NS).items,
        key=lambda rs: rs.metadata.annotations["deployment.kubernetes.io/revision"],
    )
    assert [rs.spec.replicas for rs in replica_sets] == [0, 4]
    dep = apps.read_namespaced_deployment("web", NS)
    assert dep.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    assert dep.status.observed_generation == dep.metadata.generation == 2
    progressing = next(c for c in dep.status.conditions if c.type == "Progressing")
    assert progressing.reason == "NewReplicaSetAvailable"
    assert replica_sets[1].metadata.name in progressing.message


def test_endpoints_list_ready_pods(kube_api, apis):
    core, apps = apis
    apps.create_namespaced_deployment(NS, deployment("web", ready_after=0.3, probe=True))
    core.create_namespaced_service(
        NS,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="web"),
            spec=client.V1ServiceSpec(
                selector={"app": "web"},
                ports=[client.V1ServicePort(name="http", port=80, target_port="http")],
            ),
        ),
    )

    def subset() -> client.V1EndpointSubset | None:
        found = core.read_namespaced_endpoints("web", NS).subsets
        return found[0] if found else None

    starting = kube_api.wait_for(subset)
    assert [(p.name, p.port) for p in starting.ports] == [("http", PORT)]
    ready = kube_api.wait_for(
        lambda: (s := subset()) and len(s.addresses or []) == 2 and s, timeout=10
    )
    assert not ready.not_ready_addresses
    pods = live_pods(core, "web")
    assert {a.ip for a in ready.addresses} == {p.status.pod_ip for p in pods}
    assert {a.target_ref.name for a in ready.addresses} == {p.metadata.name for p in pods}
    address = ready.addresses[0]
    status, body = get(f"http://{address.ip}:{ready.ports[0].port}/")
    assert status == 200 and json.loads(body)["pod"] == address.target_ref.name
    apps.patch_namespaced_deployment("web", NS, {"spec": {"replicas": 0}})
    kube_api.wait_for(lambda: subset() is None)
    # (the simulator answers a Status, which this client can't read as a Service)
    core.delete_namespaced_service("web", NS, _preload_content=False)
    kube_api.tick()
    assert core.list_namespaced_endpoints(NS).items == []


def test_deleting_a_deployment_removes_its_pods_and_frees_their_addresses(kube_api, apis):
    core, apps = apis
    apps.create_namespaced_deployment(NS, deployment("web", replicas=2))
    pods = kube_api.wait_for(
        lambda: (
            (found := live_pods(core, "web"))
            and all(p.status.pod_ip and is_ready(p) for p in found)
            and found
        )
    )
    addresses = {p.status.pod_ip for p in pods}
    assert addresses <= LOOPBACK.held()
    status, _ = get(f"http://{pods[0].status.pod_ip}:{PORT}/")
    assert status == 200
    apps.delete_namespaced_deployment("web", NS)
    kube_api.tick()
    assert apps.list_namespaced_replica_set(NS).items == []
    assert core.list_namespaced_pod(NS).items == []
    assert not addresses & LOOPBACK.held()
    with pytest.raises((urllib.error.URLError, ConnectionError, socket.timeout)):
        get(f"http://{pods[0].status.pod_ip}:{PORT}/")


def test_a_deleted_pod_with_a_pre_stop_sleep_serves_on_through_it_then_goes(kube_api, apis):
    core, apps = apis
    apps.create_namespaced_deployment(NS, deployment("web", replicas=1, pre_stop_sleep=1))
    (pod,) = kube_api.wait_for(
        lambda: (found := live_pods(core, "web")) and is_ready(found[0]) and found
    )
    url = f"http://{pod.status.pod_ip}:{PORT}/"
    deleted = core.delete_namespaced_pod(pod.metadata.name, NS)
    assert deleted.metadata.deletion_timestamp is not None
    kube_api.tick()
    # Terminating: still listed (marked), still answering, and already replaced.
    listed = {p.metadata.name: p for p in core.list_namespaced_pod(NS).items}
    assert listed[pod.metadata.name].metadata.deletion_timestamp is not None
    assert listed[pod.metadata.name].metadata.deletion_grace_period_seconds == 30
    assert len(listed) == 2
    assert get(url)[0] == 200
    # A second delete changes nothing; after the sleep the pod and its server go.
    core.delete_namespaced_pod(pod.metadata.name, NS)
    kube_api.wait_for(
        lambda: (
            pod.metadata.name not in {p.metadata.name for p in core.list_namespaced_pod(NS).items}
        ),
        timeout=5,
    )
    with pytest.raises((urllib.error.URLError, ConnectionError, socket.timeout)):
        get(url)
    (replacement,) = live_pods(core, "web")
    assert replacement.metadata.name != pod.metadata.name


def test_stopping_the_cluster_stops_its_serving_pods():
    server = KubeAPIServer().start()
    try:
        server.add_node("node-a")
        body = client.ApiClient().sanitize_for_serialization(deployment("web"))
        server.create("deployments", body, namespace="default")
        pods = server.wait_for(
            lambda: (
                (found := server.list("pods", "default"))
                and all(p["status"].get("podIP") for p in found)
                and found
            )
        )
    finally:
        server.stop()
    addresses = {p["status"]["podIP"] for p in pods}
    assert len(addresses) == 2 and not addresses & LOOPBACK.held()
    assert server.errors == []
