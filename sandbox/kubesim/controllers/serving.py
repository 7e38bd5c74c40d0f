"""The kubelet's part for pods that serve HTTP: a pod a ReplicaSet owns runs a real HTTP
server (``serving.ServingPod``) on a loopback address of its own, which becomes its
``podIP``; its readiness follows its ``readinessProbe.httpGet``, probed over HTTP every
``periodSeconds`` (checked at each tick), and its server stops when the pod ends or is
deleted. A pod whose container has a ``preStop`` sleep terminates gracefully, as a
kubelet runs it: deleting it marks it (``deletionTimestamp``) and it keeps serving for the
sleep (at most its ``terminationGracePeriodSeconds``) before it goes, so those who route
to it can stop first. Their request counts are the pods' CPU and GPU use (``pod_usage``)."""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from typing import Any

from sandbox.kubesim.conditions import TERMINAL_PHASES, is_true, set_readiness
from sandbox.kubesim.controllers.pods import PodsController
from sandbox.kubesim.resources import GPU_RESOURCES, ResourceType
from sandbox.kubesim.serving import DEFAULT_PORT, ServingKnobs, ServingPod


@dataclass
class _Probe:
    """A readinessProbe.httpGet and the kubelet's running count of its outcomes."""

    path: str
    port: int | str
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int
    next_at: float
    ready: bool = False
    successes: int = 0
    failures: int = 0
    #: The last failure is not recorded as an Unhealthy event yet.
    unreported: str = ""

    def record(self, error: str) -> None:
        """Count one probe's outcome (``error`` empty: it succeeded)."""
        if not error:
            self.successes, self.failures = self.successes + 1, 0
            self.ready = self.ready or self.successes >= self.success_threshold
            return
        if self.failures == 0:
            self.unreported = error
        self.successes, self.failures = 0, self.failures + 1
        if self.failures >= self.failure_threshold:
            self.ready = False


@dataclass
class _Served:
    """A serving pod as the kubelet keeps it."""

    namespace: str
    name: str
    server: ServingPod
    probe: _Probe | None


def _pre_stop_sleep(pod: dict) -> float:
    """Seconds the pod serves on once deleted: its first container's preStop sleep,
    within its termination grace period."""
    spec = pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    sleep = ((container.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
    grace = spec.get("terminationGracePeriodSeconds", 30)
    return float(max(0, min(int(sleep.get("seconds") or 0), int(grace))))


def _plain_env(container: dict) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}


def _probe_get(address: str, port: int, path: str, timeout: float) -> str:
    """An HTTP probe as the kubelet makes it: "" on a 2xx/3xx answer, else why not."""
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"User-Agent": "kube-probe/1.33"})
        status = conn.getresponse().status
    except OSError as error:
        return f'Get "http://{address}:{port}{path}": {error}'
    finally:
        conn.close()
    return "" if 200 <= status < 400 else f"HTTP probe failed with statuscode: {status}"


class ServingKubelet(PodsController):
    """Starts, probes and stops the HTTP servers of ReplicaSets' pods."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._served: dict[str, _Served] = {}  # by pod uid
        self._terminating: dict[str, float] = {}  # deleted serving pods' uid: when they go
        self._probing = threading.Lock()

    def _delete(self, rt: ResourceType, obj: dict, policy: str = "Background") -> dict | None:
        """A serving pod with a preStop sleep is marked and goes later (``_serving_pass``);
        a second delete while it terminates changes nothing."""
        meta = obj["metadata"]
        current = (
            self._get(rt, meta.get("namespace"), meta["name"]) if rt.plural == "pods" else None
        )
        if current is None or current["metadata"]["uid"] != meta["uid"]:
            return super()._delete(rt, obj, policy)
        uid = current["metadata"]["uid"]
        if uid in self._terminating:
            return current
        seconds = _pre_stop_sleep(current)
        if not seconds or uid not in self._served:
            return super()._delete(rt, obj, policy)
        self._terminating[uid] = self._now() + seconds
        grace = current["spec"].get("terminationGracePeriodSeconds", 30)

        def mark(pod: dict) -> None:
            pod["metadata"]["deletionTimestamp"] = self._ts()
            pod["metadata"]["deletionGracePeriodSeconds"] = grace

        return self._modify(rt, current, mark)

    def _start_serving(self, pod: dict) -> tuple[str, bool] | None:
        meta = pod["metadata"]
        owners = meta.get("ownerReferences") or []
        if not any(r.get("kind") == "ReplicaSet" and r.get("controller") for r in owners):
            return super()._start_serving(pod)
        container = pod["spec"]["containers"][0]
        env = _plain_env(container)
        ports = container.get("ports") or []
        port = ports[0]["containerPort"] if ports else int(env.get("PORT") or DEFAULT_PORT)
        spec = container.get("readinessProbe") or {}
        get = spec.get("httpGet")
        probe = None
        if get is not None:
            probe = _Probe(
                path=get.get("path") or "/",
                port=get.get("port", port),
                period=float(spec.get("periodSeconds") or 10),
                timeout=float(spec.get("timeoutSeconds") or 1),
                success_threshold=int(spec.get("successThreshold") or 1),
                failure_threshold=int(spec.get("failureThreshold") or 3),
                next_at=self._now() + float(spec.get("initialDelaySeconds") or 0),
            )
        gpus = self._pod_resources(pod)
        server = ServingPod(
            meta["name"],
            port,
            ServingKnobs.from_env(env),
            gpus=int(sum(gpus.get(r, 0) for r in GPU_RESOURCES)),
            probe_path=probe.path if probe else None,
        )
        self._served[meta["uid"]] = _Served(meta["namespace"], meta["name"], server, probe)
        # What a server prints as it starts: the pod's log has a line to show.
        self.append_log(meta["namespace"], meta["name"], f"serving on {server.address}:{port}\n")
        return server.address, probe is None

    def _forget(self, rt: ResourceType, obj: dict) -> None:
        super()._forget(rt, obj)
        if rt.plural == "pods":
            self._terminating.pop(obj["metadata"]["uid"], None)
            served = self._served.pop(obj["metadata"]["uid"], None)
            if served is not None:
                served.server.stop()

    def _stop_serving(self) -> None:
        """The cluster stops: every serving pod's server stops, its address is free."""
        with self._lock:
            served, self._served = list(self._served.values()), {}
        for entry in served:
            entry.server.stop()

    def _probe_serving(self) -> None:
        """Run the readiness probes that are due, outside the store lock (they are HTTP
        requests), one thread at a time (a tick that finds another at it skips them)."""
        if not self._probing.acquire(blocking=False):
            return
        try:
            with self._lock:
                now = self._now()
                due = []
                for served in self._served.values():
                    probe = served.probe
                    if probe is not None and probe.next_at <= now:
                        probe.next_at = now + probe.period
                        due.append((served, probe))
            for served, probe in due:
                port = self._probe_port(served, probe)
                error = (
                    _probe_get(served.server.address, port, probe.path, probe.timeout)
                    if port is not None
                    else f"port {probe.port!r} is not a port of the container"
                )
                with self._lock:
                    probe.record(error)
        finally:
            self._probing.release()

    def _probe_port(self, served: _Served, probe: _Probe) -> int | None:
        """The probe's port: a number, or the name of one of the container's ports."""
        if isinstance(probe.port, int):
            return probe.port
        if probe.port.isdigit():
            return int(probe.port)
        pod = self._get(self._by_key["pods"], served.namespace, served.name) or {}
        for container in (pod.get("spec") or {}).get("containers") or []:
            for p in container.get("ports") or []:
                if p.get("name") == probe.port:
                    return int(p["containerPort"])
        return None

    def _serving_pass(self) -> None:
        """Write probe outcomes into the pods' readiness; stop the servers of pods that
        ended (failed, evicted) without being deleted."""
        prt = self._by_key["pods"]
        ts = self._ts()
        for uid, due in list(self._terminating.items()):
            served = self._served.get(uid)
            pod = served and self._get(prt, served.namespace, served.name)
            if not pod or pod["metadata"]["uid"] != uid:
                self._terminating.pop(uid, None)
            elif self._now() >= due:  # the sleep is over: the container stops, the pod goes
                self._remove(prt, pod)
        for uid, served in list(self._served.items()):
            pod = self._get(prt, served.namespace, served.name)
            if pod is None or pod["metadata"]["uid"] != uid:
                continue
            if pod["status"].get("phase") in TERMINAL_PHASES:
                del self._served[uid]
                served.server.stop()
                continue
            probe = served.probe
            if probe is None:
                continue
            if probe.unreported:
                message, probe.unreported = probe.unreported, ""
                self._emit(prt, pod, "Warning", "Unhealthy", f"Readiness probe failed: {message}")
            if is_true(pod, "Ready") != probe.ready:

                def ready(p: dict, ready: bool = probe.ready) -> None:
                    set_readiness(p, ready, ts)
                    for status in p["status"].get("containerStatuses") or []:
                        status["ready"] = ready

                self._modify(prt, pod, ready)

    def pod_usage(self, uid: str, window: float) -> tuple[float, float] | None:
        """A serving pod's CPU use (millicores) and per-GPU utilisation (percent) over
        the last ``window`` seconds; None for a pod that doesn't serve."""
        with self._lock:
            served = self._served.get(uid)
        if served is None:
            return None
        return served.server.cpu_millicores(window), served.server.gpu_utilization(window)

    def serving_gpu_pods(self, window: float) -> list[tuple[str, str, str, int, float]]:
        """(uid, namespace, name, GPUs, percent busy over the last ``window`` seconds) of
        each serving pod with GPUs, for the sandbox's DCGM readings."""
        with self._lock:
            served = [(uid, s) for uid, s in self._served.items() if s.server.gpus]
        return [
            (uid, s.namespace, s.name, s.server.gpus, s.server.gpu_utilization(window))
            for uid, s in served
        ]
