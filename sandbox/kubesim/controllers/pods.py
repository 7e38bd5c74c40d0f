"""The scheduler and the kubelet: pending pods are bound first-fit to a node whose
labels, taints, readiness and free allocatable fit them; bound pods start Running
(after ``pod_start_delay``) and then do what ``pod_script`` says (``PodRun``): write
log lines at start and as they run, and end after a while with an exit code. A pod that
serves HTTP runs its server instead (``_start_serving``, see controllers.serving)."""

from __future__ import annotations

import base64
import copy
import threading
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sandbox.kubesim.admission import Admission
from sandbox.kubesim.conditions import TERMINAL_PHASES, set_condition, set_readiness
from sandbox.kubesim.logs import Logs
from sandbox.kubesim.resources import ResourceType, parse_quantity


@dataclass
class PodRun:
    """What a started pod does, as returned by ``server.pod_script(pod)``.

    ``duration`` seconds after it starts (None: forever) the pod ends with ``exit_code``;
    ``logs`` are appended to its first container's log when it starts. ``ticker``, if
    set, is called on every controller tick while the pod runs, with the seconds since
    it started (never past ``duration``), and returns the log lines written since the
    last call; they are appended to the same log. ``exited``, for a pod without a
    ``duration`` whose end isn't known up front (a process it runs), is asked on every
    tick: an exit code once it has ended (then the ticker gets its last call), else None;
    ``stop`` is called when the pod is deleted before (its container is killed).
    """

    duration: float | None = None
    exit_code: int = 0
    logs: tuple[str, ...] | list[str] = ()
    ticker: Callable[[float], Iterable[str]] | None = None
    exited: Callable[[], int | None] | None = None
    stop: Callable[[], None] | None = None


@dataclass
class _Running:
    """A started pod's PodRun, as the kubelet keeps it until the pod ends."""

    namespace: str
    name: str
    started_at: float
    duration: float | None
    exit_code: int
    ticker: Callable[[float], Iterable[str]] | None
    exited: Callable[[], int | None] | None = None
    stop: Callable[[], None] | None = None
    #: The ticker has been called at ``duration``: the pod may end now.
    flushed: bool = False

    @property
    def ends_at(self) -> float | None:
        return None if self.duration is None else self.started_at + self.duration


class PodsController(Admission, Logs):
    """Binds pending pods to nodes, starts them, runs their ``PodRun`` and ends them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pod_runs: dict[str, _Running] = {}  # by pod uid
        self._bound_at: dict[str, float] = {}
        self._sched_msgs: dict[str, str] = {}  # the last FailedScheduling message, by pod uid
        self._tickers_running = threading.Lock()
        #: Called with a copy of each pod when it starts running; may return a PodRun.
        self.pod_script: Callable[[dict], PodRun | None] | None = None
        #: Seconds between binding a pod to a node and it Running.
        self.pod_start_delay = 0.0

    def _forget(self, rt: ResourceType, obj: dict) -> None:
        super()._forget(rt, obj)
        if rt.plural == "pods":
            uid = obj["metadata"]["uid"]
            run = self._pod_runs.pop(uid, None)
            if run is not None and run.stop is not None:
                run.stop()
            self._bound_at.pop(uid, None)
            self._sched_msgs.pop(uid, None)

    @staticmethod
    def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
        for t in tolerations:
            if t.get("effect") and t["effect"] != taint.get("effect"):
                continue
            if t.get("operator") == "Exists":
                if not t.get("key") or t["key"] == taint.get("key"):
                    return True
            elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
                taint.get("value") or ""
            ):
                return True
        return False

    @staticmethod
    def _affinity_ok(pod_spec: dict, labels: dict) -> bool:
        for k, v in (pod_spec.get("nodeSelector") or {}).items():
            if labels.get(k) != v:
                return False
        req = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        terms = req.get("nodeSelectorTerms") or []
        if not terms:
            return True

        def expr_ok(e: dict) -> bool:
            k, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
            v = labels.get(k)
            if op == "In":
                return v in vals
            if op == "NotIn":
                return v not in vals
            if op == "Exists":
                return k in labels
            if op == "DoesNotExist":
                return k not in labels
            if op in ("Gt", "Lt") and v is not None and vals:
                try:
                    return int(v) > int(vals[0]) if op == "Gt" else int(v) < int(vals[0])
                except ValueError:
                    return False
            return False

        return any(all(expr_ok(e) for e in t.get("matchExpressions") or []) for t in terms)

    def _node_rejects(
        self, node: dict, pod: dict, req: dict[str, Fraction], used: Counter, npods: int
    ) -> str | None:
        nspec, nstatus = node.get("spec") or {}, node.get("status") or {}
        pspec = pod.get("spec") or {}
        if nspec.get("unschedulable"):
            return "node(s) were unschedulable"
        ready = next((c for c in nstatus.get("conditions") or [] if c["type"] == "Ready"), None)
        if ready is None or ready.get("status") != "True":
            return "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
        for taint in nspec.get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not self._tolerated(
                taint, pspec.get("tolerations") or []
            ):
                return (
                    f"node(s) had untolerated taint {{{taint.get('key')}: "
                    f"{taint.get('value') or ''}}}"
                )
        if not self._affinity_ok(pspec, node["metadata"].get("labels") or {}):
            return "node(s) didn't match Pod's node affinity/selector"
        alloc = nstatus.get("allocatable") or {}
        if "pods" in alloc and npods + 1 > parse_quantity(alloc["pods"]):
            return "Too many pods"
        for res, amount in sorted(req.items()):
            if amount <= 0:
                continue
            if res not in alloc:
                if res in ("cpu", "memory", "ephemeral-storage"):
                    continue
                return f"Insufficient {res}"
            if used[res] + amount > parse_quantity(alloc[res]):
                return f"Insufficient {res}"
        return None

    def _pods_pass(self) -> None:
        prt, nrt = self._by_key["pods"], self._by_key["nodes"]
        now, ts = self._now(), self._ts()
        nodes = self._objects(nrt)
        used: dict[str, Counter] = {n["metadata"]["name"]: Counter() for n in nodes}
        counts: Counter = Counter()
        pods = self._objects(prt)
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node in used and p["status"].get("phase") not in TERMINAL_PHASES:
                used[node].update(self._pod_resources(p))
                counts[node] += 1
        pending = sorted(
            (p for p in pods if p["status"].get("phase") == "Pending"),
            key=lambda p: (
                p["metadata"]["creationTimestamp"],
                int(p["metadata"]["resourceVersion"]),
            ),
        )
        for p in pending:
            uid = p["metadata"]["uid"]
            spec = p.get("spec") or {}
            if spec.get("nodeName"):
                bound = self._bound_at.setdefault(uid, now)
                if now >= bound + self.pod_start_delay:
                    self._start_pod(p)
                continue
            if spec.get("schedulingGates"):

                def gated(q: dict) -> None:
                    set_condition(
                        q["status"].setdefault("conditions", []),
                        "PodScheduled",
                        "False",
                        "SchedulingGated",
                        "Scheduling is blocked due to non-empty scheduling gates",
                        ts,
                    )

                self._modify(prt, p, gated)
                continue
            req = self._pod_resources(p)
            reasons: Counter = Counter()
            chosen = None
            for n in nodes:
                nname = n["metadata"]["name"]
                why = self._node_rejects(n, p, req, used[nname], counts[nname])
                if why is None:
                    chosen = n
                    break
                reasons[why] += 1
            if chosen is not None:
                nname = chosen["metadata"]["name"]
                used[nname].update(req)
                counts[nname] += 1
                self._bound_at[uid] = now
                self._sched_msgs.pop(uid, None)

                def bind(q: dict, nname: str = nname) -> None:
                    q["spec"]["nodeName"] = nname
                    set_condition(
                        q["status"].setdefault("conditions", []), "PodScheduled", "True", "", "", ts
                    )

                bound = self._modify(prt, p, bind)
                self._emit(
                    prt,
                    bound,
                    "Normal",
                    "Scheduled",
                    f"Successfully assigned {p['metadata']['namespace']}/{p['metadata']['name']} "
                    f"to {nname}",
                    "default-scheduler",
                )
                continue
            if nodes:
                detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
                msg = f"0/{len(nodes)} nodes are available: {detail}."
            else:
                msg = "no nodes available to schedule pods"

            def unsched(q: dict, msg: str = msg) -> None:
                set_condition(
                    q["status"].setdefault("conditions", []),
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                    msg,
                    ts,
                )

            p2 = self._modify(prt, p, unsched)
            if self._sched_msgs.get(uid) != msg:
                self._sched_msgs[uid] = msg
                self._emit(prt, p2, "Warning", "FailedScheduling", msg, "default-scheduler")
        for p in self._objects(prt):
            run = self._pod_runs.get(p["metadata"]["uid"])
            if run and run.exited is not None and run.duration is None:
                code = run.exited()
                if code is not None:  # it ends now, after its ticker's last call
                    run.duration, run.exit_code = max(now - run.started_at, 0.0), code
            if (
                run
                and run.ends_at is not None
                and (run.ticker is None or run.flushed)
                and p["status"].get("phase") == "Running"
                and now >= run.ends_at
            ):
                code = run.exit_code
                self._terminate(
                    p,
                    "Succeeded" if code == 0 else "Failed",
                    code,
                    "Completed" if code == 0 else "Error",
                )

    def _start_pod(self, pod: dict) -> None:
        prt, nrt = self._by_key["pods"], self._by_key["nodes"]
        ts = self._ts()
        node = self._get(nrt, None, pod["spec"]["nodeName"]) or {}
        host_ip = next(
            (
                a["address"]
                for a in (node.get("status") or {}).get("addresses") or []
                if a["type"] == "InternalIP"
            ),
            "10.0.0.1",
        )
        serving = self._start_serving(pod)
        if serving is None:
            n = next(self._ips)
            pod_ip, ready = f"10.244.{n // 250 % 250}.{n % 250 + 1}", True
        else:
            pod_ip, ready = serving

        def fn(q: dict) -> None:
            st = q["status"]
            st.update(
                phase="Running",
                hostIP=host_ip,
                hostIPs=[{"ip": host_ip}],
                podIP=pod_ip,
                podIPs=[{"ip": pod_ip}],
                startTime=ts,
            )
            conds = st.setdefault("conditions", [])
            for ctype in ("PodReadyToStartContainers", "Initialized"):
                set_condition(conds, ctype, "True", "", "", ts)
            set_readiness(q, ready, ts)
            st["containerStatuses"] = [
                {
                    "name": c["name"],
                    "image": c.get("image"),
                    "imageID": f"{c.get('image')}@sha256:{'0' * 64}",
                    "containerID": f"containerd://{uuid.uuid4().hex}",
                    "ready": ready,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": ts}},
                }
                for c in q["spec"]["containers"]
            ]

        started = self._modify(prt, pod, fn)
        self._emit(
            prt,
            started,
            "Normal",
            "Started",
            f"Started container {pod['spec']['containers'][0]['name']}",
            "kubelet",
        )
        if self.pod_script is not None and serving is None:
            run = self.pod_script(self._with_secret_values(started))
            if run is not None:
                m = started["metadata"]
                for line in run.logs:
                    self.append_log(m["namespace"], m["name"], line)
                if run.duration is not None or run.ticker is not None or run.exited:
                    self._pod_runs[m["uid"]] = _Running(
                        m["namespace"],
                        m["name"],
                        self._now(),
                        run.duration,
                        run.exit_code,
                        run.ticker,
                        run.exited,
                        run.stop,
                    )

    def _start_serving(self, pod: dict) -> tuple[str, bool] | None:
        """Start what a pod that serves HTTP runs (see controllers.serving): its pod IP
        and whether it is ready at once; None for a pod that doesn't serve."""
        return None

    def _with_secret_values(self, pod: dict) -> dict:
        """A copy of the pod whose containers' `secretKeyRef` variables carry their
        values, as the kubelet resolves them when it starts a container (a missing
        Secret or key stays unresolved)."""
        pod = copy.deepcopy(pod)
        namespace = pod["metadata"].get("namespace") or ""
        secrets = self._by_key["secrets"]
        for container in pod["spec"].get("containers") or []:
            for entry in container.get("env") or []:
                ref = (entry.get("valueFrom") or {}).get("secretKeyRef") or {}
                secret = self._get(secrets, namespace, ref.get("name", "")) if ref else None
                if secret is None:
                    continue
                data = secret.get("data") or {}
                if ref.get("key") in data:
                    entry.pop("valueFrom")
                    entry["value"] = base64.b64decode(data[ref["key"]]).decode()
                elif ref.get("key") in (secret.get("stringData") or {}):
                    entry.pop("valueFrom")
                    entry["value"] = secret["stringData"][ref["key"]]
        return pod

    def _terminate(
        self,
        pod: dict,
        phase: str,
        code: int,
        reason: str,
        disruption: tuple[str, str] | None = None,
    ) -> dict:
        ts = self._ts()

        def fn(p: dict) -> None:
            st = p.setdefault("status", {})
            st["phase"] = phase
            prev = {s["name"]: s for s in st.get("containerStatuses") or []}
            statuses = []
            for c in p["spec"]["containers"]:
                old = prev.get(c["name"], {})
                started = (old.get("state") or {}).get("running", {}).get("startedAt", ts)
                statuses.append(
                    {
                        "name": c["name"],
                        "image": c.get("image"),
                        "imageID": old.get("imageID", ""),
                        "containerID": old.get("containerID", ""),
                        "ready": False,
                        "started": False,
                        "restartCount": old.get("restartCount", 0),
                        "state": {
                            "terminated": {
                                "exitCode": code,
                                "reason": reason,
                                "startedAt": started,
                                "finishedAt": ts,
                                "containerID": old.get("containerID", ""),
                            }
                        },
                    }
                )
            st["containerStatuses"] = statuses
            conds = st.setdefault("conditions", [])
            why = "PodCompleted" if phase == "Succeeded" else "PodFailed"
            for ctype in ("Ready", "ContainersReady"):
                set_condition(conds, ctype, "False", why, "", ts)
            if disruption:
                set_condition(conds, "DisruptionTarget", "True", disruption[0], disruption[1], ts)

        self._pod_runs.pop(pod["metadata"]["uid"], None)
        return self._modify(self._by_key["pods"], pod, fn)

    def _evict(self, ns: str, name: str, reason: str, message: str) -> dict:
        with self._lock:
            rt = self._by_key["pods"]
            pod = self._must_get(rt, ns, name)
            if pod["status"].get("phase") in TERMINAL_PHASES:
                return copy.deepcopy(pod)
            out = self._terminate(pod, "Failed", 137, "Error", disruption=(reason, message))
            self._emit(
                rt,
                out,
                "Warning",
                "Preempted" if reason == "PreemptionByScheduler" else "Evicted",
                message,
            )
            return copy.deepcopy(out)

    def _run_tickers(self) -> None:
        """Append what the running pods' ``PodRun.ticker`` return to their logs.

        Tickers are the caller's code: they run outside the store lock and one thread at
        a time (a tick that finds another thread at it leaves the work to that one). A
        pod with a ticker ends only after its ticker was called at ``duration``, the
        last call it gets; one that raises is reported in ``errors`` and not called
        again."""
        if not self._tickers_running.acquire(blocking=False):
            return
        try:
            with self._lock:
                now = self._now()
                due = [
                    (uid, run, run.ticker, now - run.started_at)
                    for uid, run in self._pod_runs.items()
                    if run.ticker is not None and not run.flushed and self._still_running(uid, run)
                ]
            for uid, run, ticker, elapsed in due:
                self._run_ticker(uid, run, ticker, elapsed)
        finally:
            self._tickers_running.release()

    def _run_ticker(
        self, uid: str, run: _Running, ticker: Callable[[float], Iterable[str]], elapsed: float
    ) -> None:
        final = run.duration is not None and elapsed >= run.duration
        if run.duration is not None:
            elapsed = min(elapsed, run.duration)
        try:
            lines = list(ticker(max(0.0, elapsed)))
        except Exception:
            run.ticker = None  # the pod ends as if it had none
            self.errors.append(traceback.format_exc())
            return
        text = "".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines)
        with self._lock:
            if not self._still_running(uid, run):
                return
            if text:
                self.append_log(run.namespace, run.name, text)
            run.flushed = final

    def _still_running(self, uid: str, run: _Running) -> bool:
        pod = self._get(self._by_key["pods"], run.namespace, run.name)
        return (
            pod is not None
            and pod["metadata"]["uid"] == uid
            and self._pod_runs.get(uid) is run
            and (pod.get("status") or {}).get("phase") == "Running"
        )
