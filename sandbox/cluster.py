"""The sandbox cluster: the Kubernetes simulator with GPU nodes, simulated workloads, a
Prometheus-compatible endpoint for their DCGM readings, and chaos controls.

Served by one HTTP server (its own process, see `sandbox.__main__`):
- the Kubernetes API (what the console's Kubernetes backend talks to, bearer token);
- ``GET /prometheus/api/v1/query``: an instant vector of every running pod's DCGM
  series (training runs', and serving pods' as busy as their requests keep them),
  labelled as dcgm-exporter's are when Prometheus scrapes them through a ServiceMonitor
  (``exported_pod``, ``exported_namespace``, ``gpu``); the console reads it through the
  same code path as a real Prometheus;
- ``/sandbox/v1/…``: chaos controls (reclaim spot capacity, fail or recover a node, make
  the API server fail or slow down), with the same bearer token.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sandbox.kubesim import ApiError, KubeAPIServer
from sandbox.workload import Workloads

POOL_LABEL = "gpugeek.io/pool"
TIER_LABEL = "gpugeek.io/tier"
GPU_PRODUCT_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name", "accelerator")
UNREACHABLE_TAINT = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
RECLAIM_MESSAGE = "Node is shutting down: spot capacity reclaimed by the provider"
NODE_FAILURE_MESSAGE = "Taint manager: deleting due to NoExecute taint (node unreachable)"
MAX_FAULT_SECONDS = 3600

Reply = tuple[int, dict | str, str]


class ChaosError(ValueError):
    """A chaos request that can't be carried out (its message is the 4xx body)."""


class SandboxCluster:
    def __init__(
        self,
        nodes: Iterable[dict],
        *,
        token: str,
        port: int = 0,
        tick_seconds: float = 0.25,
        pod_start_delay: float = 2.0,
        volume_root: Path | None = None,
    ) -> None:
        self.token = token
        self.server = KubeAPIServer(auto_tick=tick_seconds, token=token, port=port)
        self.server.pod_start_delay = pod_start_delay
        self.workloads = Workloads(clock=time.monotonic, volume_root=volume_root)
        # XID error codes injected per node (chaos): its GPUs report them until it recovers.
        self.xid_errors: dict[str, int] = {}
        # Nodes whose GPUs hang (chaos): their pods run on but their GPUs read 0 % busy.
        self.stuck_nodes: set[str] = set()
        self.server.pod_script = self.workloads.play
        self.server.add_route("/prometheus/", self._prometheus)
        self.server.add_route("/sandbox/", self._control)
        for node in nodes:
            self.server.add_node(
                node["name"],
                labels=node.get("labels") or {},
                allocatable=node.get("allocatable"),
                taints=node.get("taints") or None,
            )

    def start(self) -> SandboxCluster:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    # --- the Prometheus HTTP API (instant queries) ----------------------------------------
    def _prometheus(self, method: str, path: str, query: dict, body: bytes, headers: Any) -> Reply:
        if not path.startswith("/prometheus/api/v1/query"):
            return 404, {"status": "error", "error": f"{path} is not served"}, "application/json"
        products, hosts = self._running_gpu_products()
        serving = self.server.serving_gpu_pods(self.server.metrics_window_seconds)
        readings = self.workloads.gpu_readings(products)
        readings += self.workloads.serving_readings(products, serving)
        result = []
        for namespace, pod, gpu, fields in readings:
            host = hosts.get((namespace, pod), "")
            xid = self.xid_errors.get(host)
            # dcgm-exporter names the node as `Hostname`; an XID error's code is a gauge.
            series = {**fields, "DCGM_FI_DEV_XID_ERRORS": xid} if xid else dict(fields)
            if xid == 48:  # XID 48 is a double-bit ECC error: the DBE counter rises too
                series["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] = 1
            if host in self.stuck_nodes:
                series["DCGM_FI_DEV_GPU_UTIL"] = 0
            result += [
                {
                    "metric": {
                        "__name__": name,
                        "exported_namespace": namespace,
                        "exported_pod": pod,
                        "gpu": str(gpu),
                        "Hostname": host,
                        "job": "dcgm-exporter",
                    },
                    "value": [time.time(), str(value)],
                }
                for name, value in series.items()
            ]
        data = {"resultType": "vector", "result": result}
        return 200, {"status": "success", "data": data}, "application/json"

    def _running_gpu_products(self) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
        """Each running pod's node's GPU product (by pod uid), and its node (by namespace
        and name)."""
        products, hosts = {}, {}
        nodes = {node["metadata"]["name"]: node for node in self.server.list("nodes")}
        for pod in self.server.list("pods", field_selector="status.phase=Running"):
            node_name = pod["spec"].get("nodeName", "")
            labels = nodes.get(node_name, {}).get("metadata", {}).get("labels") or {}
            product = next((labels[k] for k in GPU_PRODUCT_LABELS if k in labels), "")
            products[pod["metadata"]["uid"]] = product
            hosts[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = node_name
        return products, hosts

    # --- chaos controls -------------------------------------------------------------------
    def _control(self, method: str, path: str, query: dict, body: bytes, headers: Any) -> Reply:
        given = (headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return 401, {"error": "a valid bearer token is required"}, "application/json"
        try:
            payload = json.loads(body or b"{}") if method in ("POST", "PUT") else {}
            if not isinstance(payload, dict):
                raise ChaosError("the body must be a JSON object")
            routes = {
                ("GET", "/sandbox/v1/nodes"): self.nodes,
                ("POST", "/sandbox/v1/reclaim-spot"): self.reclaim_spot,
                ("POST", "/sandbox/v1/fail-node"): self.fail_node,
                ("POST", "/sandbox/v1/recover-node"): self.recover_node,
                ("POST", "/sandbox/v1/xid-error"): self.xid_error,
                ("POST", "/sandbox/v1/stuck-gpus"): self.stuck_gpus,
                ("POST", "/sandbox/v1/api-faults"): self.api_faults,
                ("DELETE", "/sandbox/v1/api-faults"): self.clear_api_faults,
            }
            action = routes.get((method, path.rstrip("/")))
            if action is None:
                return 404, {"error": f"no {method} {path}"}, "application/json"
            return 200, action(**payload), "application/json"
        except TypeError as error:
            return 400, {"error": f"unexpected fields: {error}"}, "application/json"
        except (ChaosError, ValueError) as error:
            return 400, {"error": str(error)}, "application/json"

    def nodes(self) -> dict:
        pods_by_node: dict[str, int] = {}
        for pod in self.server.list("pods"):
            if pod["status"].get("phase") in ("Pending", "Running") and pod["spec"].get("nodeName"):
                pods_by_node[pod["spec"]["nodeName"]] = (
                    pods_by_node.get(pod["spec"]["nodeName"], 0) + 1
                )
        listed = []
        for node in self.server.list("nodes"):
            labels = node["metadata"].get("labels") or {}
            ready = next(
                (
                    c["status"] == "True"
                    for c in node["status"]["conditions"]
                    if c["type"] == "Ready"
                ),
                False,
            )
            listed.append(
                {
                    "name": node["metadata"]["name"],
                    "pool": labels.get(POOL_LABEL, ""),
                    "tier": labels.get(TIER_LABEL, "on_demand"),
                    "ready": ready,
                    "pods": pods_by_node.get(node["metadata"]["name"], 0),
                    "xid": self.xid_errors.get(node["metadata"]["name"], 0),
                    "stuck": node["metadata"]["name"] in self.stuck_nodes,
                }
            )
        return {"nodes": listed}

    def _pool_nodes(self, pool: str) -> list[dict]:
        if not isinstance(pool, str) or not pool:
            raise ChaosError("pool: give the slug of a node pool")
        nodes = self.server.list("nodes", label_selector=f"{POOL_LABEL}={pool}")
        if not nodes:
            raise ChaosError(f"pool {pool!r} has no nodes in the sandbox")
        return nodes

    def _running_pods_on(self, node_names: set[str]) -> list[dict]:
        return [
            pod
            for pod in self.server.list("pods")
            if pod["spec"].get("nodeName") in node_names
            and pod["status"].get("phase") in ("Pending", "Running")
        ]

    def reclaim_spot(self, pool: str) -> dict:
        """The provider takes a spot pool's capacity back: every pod on its nodes is
        disrupted (a DisruptionTarget condition, as a node shutdown leaves it)."""
        nodes = self._pool_nodes(pool)
        if any(node["metadata"]["labels"].get(TIER_LABEL) != "spot" for node in nodes):
            raise ChaosError(f"pool {pool!r} is not a spot pool")
        names = {node["metadata"]["name"] for node in nodes}
        evicted = self._disrupt(names, "TerminationByKubelet", RECLAIM_MESSAGE)
        return {"pool": pool, "evicted_pods": evicted}

    def _disrupt(self, node_names: set[str], reason: str, message: str) -> list[str]:
        """Disrupt every live pod on these nodes at once, as a node going away does; the
        controllers react after the last one. (Reacting after each would let the first
        evicted pod of a multi-node Job fail that Job, whose controller then deletes its
        other pods under this loop.) A pod deleted meanwhile (by an API call) is skipped."""
        evicted = []
        with self.server.paused():
            for pod in self._running_pods_on(node_names):
                meta = pod["metadata"]
                try:
                    self.server.evict_pod(meta["namespace"], meta["name"], reason, message)
                except ApiError as error:
                    if error.code != 404:
                        raise
                    continue
                evicted.append(f"{meta['namespace']}/{meta['name']}")
        self.server.tick()
        return evicted

    def fail_node(self, node: str) -> dict:
        """The node stops answering: NotReady, tainted unreachable, its pods disrupted."""
        self._must_have_node(node)
        self.server.set_node_ready(node, False)
        self.server.mutate("nodes", None, node, _add_taint)
        evicted = self._disrupt({node}, "DeletionByTaintManager", NODE_FAILURE_MESSAGE)
        return {"node": node, "ready": False, "evicted_pods": evicted}

    def recover_node(self, node: str) -> dict:
        self._must_have_node(node)
        self.server.mutate("nodes", None, node, _remove_taint)
        self.server.set_node_ready(node, True)
        self.xid_errors.pop(node, None)
        self.stuck_nodes.discard(node)
        return {"node": node, "ready": True}

    def stuck_gpus(self, node: str) -> dict:
        """The node's GPUs hang: its pods keep running but read 0 % busy from now on (a
        stuck rank while the job's other ranks run), until the node recovers."""
        self._must_have_node(node)
        self.stuck_nodes.add(node)
        return {"node": node, "stuck": True}

    def xid_error(self, node: str, code: int = 79) -> dict:
        """The node's GPUs report an XID error (79: fallen off the bus; 48: a double-bit
        ECC error) from now on, through the DCGM readings, until the node recovers. The
        node keeps running: what the console makes of it is the console's business."""
        self._must_have_node(node)
        if isinstance(code, bool) or not isinstance(code, int) or not 0 < code < 1000:
            raise ChaosError("code: an XID error number from 1 to 999")
        self.xid_errors[node] = code
        return {"node": node, "xid": code}

    def _must_have_node(self, node: str) -> None:
        if not isinstance(node, str) or self.server.get("nodes", None, node) is None:
            raise ChaosError(f"node {node!r} does not exist in the sandbox")

    def api_faults(
        self, mode: str = "error", fraction: float = 0.3, seconds: float = 60, delay: float = 2.0
    ) -> dict:
        """For `seconds`, answer `fraction` of Kubernetes API calls with a 500 (`error`)
        or `delay` seconds late (`slow`)."""
        try:
            fraction, seconds, delay = float(fraction), float(seconds), float(delay)
        except (TypeError, ValueError) as error:
            raise ChaosError("fraction, seconds and delay must be numbers") from error
        if not 0 < fraction <= 1:
            raise ChaosError("fraction must be in (0, 1]")
        if not 0 < seconds <= MAX_FAULT_SECONDS:
            raise ChaosError(f"seconds must be in (0, {MAX_FAULT_SECONDS}]")
        if mode == "error":
            self.server.fail_fraction(fraction, seconds, status=500)
        elif mode == "slow":
            if not 0 < delay <= 30:
                raise ChaosError("delay must be in (0, 30] seconds")
            self.server.slow_fraction(fraction, seconds, delay)
        else:
            raise ChaosError("mode must be 'error' or 'slow'")
        return {"mode": mode, "fraction": fraction, "seconds": seconds}

    def clear_api_faults(self) -> dict:
        self.server.clear_faults()
        return {"cleared": True}


def _add_taint(node: dict) -> None:
    taints = node["spec"].setdefault("taints", [])
    if not any(t.get("key") == UNREACHABLE_TAINT["key"] for t in taints):
        taints.append(dict(UNREACHABLE_TAINT))


def _remove_taint(node: dict) -> None:
    taints = [
        t for t in node["spec"].get("taints") or [] if t.get("key") != UNREACHABLE_TAINT["key"]
    ]
    if taints:
        node["spec"]["taints"] = taints
    else:
        node["spec"].pop("taints", None)
