"""What a test or the sandbox does to the cluster directly, without the HTTP API: read
and change objects, add, remove and cordon nodes, end, fail and evict pods, and wait
for a condition while the controllers run."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable
from typing import Any

from sandbox.kubesim.conditions import TERMINAL_PHASES
from sandbox.kubesim.controllers import Controllers
from sandbox.kubesim.selectors import parse_field_selector, parse_label_selector


class ClusterHelpers(Controllers):
    """Direct access to the store and simulated nodes and pods; each change runs the
    controllers at once (unless ``paused()``)."""

    def get(self, resource: str, namespace: str | None, name: str) -> dict | None:
        """A copy of an object, or None."""
        with self._lock:
            obj = self._get(self._rt(resource), namespace, name)
            return copy.deepcopy(obj) if obj is not None else None

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict]:
        with self._lock:
            rt = self._rt(resource)
            lsel = parse_label_selector(label_selector)
            fsel = parse_field_selector(field_selector)
            return [
                copy.deepcopy(o)
                for o in self._objects(rt, namespace)
                if self._matches(o, None, lsel, fsel)
            ]

    def create(self, resource: str, obj: dict, namespace: str | None = None) -> dict:
        """Create an object directly (same validation and admission as the API)."""
        with self._lock:
            return copy.deepcopy(self._create(self._rt(resource), namespace, obj))

    def mutate(
        self, resource: str, namespace: str | None, name: str, fn: Callable[[dict], None]
    ) -> dict:
        """Change an object in place through ``fn(obj)`` (status included), as a controller
        would; emits a MODIFIED event when anything changed."""
        with self._lock:
            rt = self._rt(resource)
            return copy.deepcopy(self._modify(rt, self._must_get(rt, namespace, name), fn))

    def delete(
        self, resource: str, namespace: str | None, name: str, propagation: str = "Background"
    ) -> None:
        with self._lock:
            rt = self._rt(resource)
            self._delete(rt, self._must_get(rt, namespace, name), propagation)

    def job_pods(self, namespace: str, job: str) -> list[dict]:
        """Copies of the pods the named Job owns (terminal ones included), by name."""
        with self._lock:
            j = self._get(self._by_key["jobs.batch"], namespace, job)
            if j is None:
                return []
            return [copy.deepcopy(p) for p in self._owned_pods(j)]

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
        """Tick until ``predicate()`` is truthy; return its value or raise TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout:.1f}s")
            time.sleep(0.02)

    def add_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        allocatable: dict[str, str] | None = None,
        taints: list[dict] | None = None,
        capacity: dict[str, str] | None = None,
        ready: bool = True,
        unschedulable: bool = False,
    ) -> dict:
        """Add a simulated node (8 NVIDIA GPUs, 96 CPUs, 1Ti by default)."""
        alloc = dict(
            allocatable
            if allocatable is not None
            else {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}
        )
        alloc.setdefault("pods", "110")
        n = next(self._ips)
        ts = self._ts()
        node = {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
            },
            "spec": {"taints": list(taints or [])},
            "status": {
                "capacity": dict(capacity or alloc),
                "allocatable": alloc,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if ready else "False",
                        "reason": "KubeletReady" if ready else "KubeletNotReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": ts,
                        "lastTransitionTime": ts,
                    }
                ],
                "addresses": [
                    {"type": "InternalIP", "address": f"10.0.{n // 250 % 250}.{n % 250 + 1}"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name + ".boot")),
                    "containerRuntimeVersion": "containerd://2.0.0",
                    "kernelVersion": "6.8.0-fake",
                    "kubeProxyVersion": "",
                    "kubeletVersion": "v1.33.0-fake",
                    "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                    "operatingSystem": "linux",
                    "osImage": "Ubuntu 24.04 LTS",
                    "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                },
            },
        }
        if not taints:
            node["spec"].pop("taints")
        if unschedulable:
            node["spec"]["unschedulable"] = True
        with self._lock:
            obj = self._create(self._by_key["nodes"], None, node, keep_status=True)
        self._react()
        return copy.deepcopy(obj)

    def set_node_ready(self, name: str, ready: bool) -> None:
        def fn(n: dict) -> None:
            for c in n["status"]["conditions"]:
                if c["type"] == "Ready":
                    c["status"] = "True" if ready else "False"
                    c["reason"] = "KubeletReady" if ready else "KubeletNotReady"
                    c["lastTransitionTime"] = self._ts()

        with self._lock:
            rt = self._by_key["nodes"]
            self._modify(rt, self._must_get(rt, None, name), fn)
        self._react()

    def remove_node(self, name: str) -> None:
        """Delete a node; its running pods fail with DisruptionTarget/DeletionByPodGC."""
        with self._lock:
            rt = self._by_key["nodes"]
            self._delete(rt, self._must_get(rt, None, name))
            for p in self._objects(self._by_key["pods"]):
                if (p.get("spec") or {}).get("nodeName") == name and p["status"].get(
                    "phase"
                ) not in TERMINAL_PHASES:
                    self._terminate(
                        p,
                        "Failed",
                        137,
                        "Error",
                        disruption=("DeletionByPodGC", "PodGC: node no longer exists"),
                    )
        self._react()

    def succeed_pod(self, namespace: str, name: str, exit_code: int = 0) -> dict:
        """End a pod with phase Succeeded (its containers exit with ``exit_code``)."""
        return self._end_pod(namespace, name, "Succeeded", exit_code, "Completed")

    def fail_pod(
        self, namespace: str, name: str, exit_code: int = 1, reason: str = "Error"
    ) -> dict:
        """End a pod with phase Failed (its containers exit with ``exit_code``)."""
        return self._end_pod(namespace, name, "Failed", exit_code, reason)

    def succeed_job(self, namespace: str, job: str) -> None:
        """Make every active pod of a Job succeed."""
        for p in self.job_pods(namespace, job):
            if p["status"].get("phase") not in TERMINAL_PHASES:
                self.succeed_pod(namespace, p["metadata"]["name"])

    def _end_pod(self, ns: str, name: str, phase: str, code: int, reason: str) -> dict:
        with self._lock:
            pod = self._must_get(self._by_key["pods"], ns, name)
            out = self._terminate(pod, phase, code, reason)
        self._react()
        return copy.deepcopy(out)

    def evict_pod(
        self,
        namespace: str,
        name: str,
        reason: str = "EvictionByEvictionAPI",
        message: str | None = None,
    ) -> dict:
        """Disrupt a pod: it becomes Failed (exit code 137) with a ``DisruptionTarget``
        condition of ``reason`` (EvictionByEvictionAPI, PreemptionByScheduler,
        DeletionByTaintManager, TerminationByKubelet, DeletionByPodGC)."""
        default_msgs = {
            "EvictionByEvictionAPI": "Eviction API: evicting",
            "PreemptionByScheduler": "default-scheduler: preempting to accommodate a higher "
            "priority pod",
            "DeletionByTaintManager": "Taint manager: deleting due to NoExecute taint",
            "TerminationByKubelet": "Kubelet: node-pressure eviction",
        }
        out = self._evict(namespace, name, reason, message or default_msgs.get(reason, reason))
        self._react()
        return out
