"""What the Kubernetes fault tests share: a sandbox cluster made from the demo pools with
the real Kubernetes backend pointed at it (as in tests/jobs/test_sandbox.py), an
in-process Celery worker, and observers that count from the simulated API server's own
store (never from our database): every Job and pod it ever stored, and every request and
the fault it got."""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection

from console.celery import app
from jobs.backends import get_backend
from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.namespaces import namespaces_forget_all
from jobs.backends.kubernetes.sandbox import sandbox_nodes, write_sandbox_files
from jobs.models import Job
from marketplace.demo import seed_catalog
from marketplace.models import NodePool
from marketplace.services import capacity_sync
from sandbox.cluster import SandboxCluster
from tests.broker import run_body
from tests.faults.helpers import REPORTED

TOKEN = "faults-sandbox-token"
H100_ON_DEMAND = "demo-us-west-h100-80gb-on-demand"
H100_SPOT = "demo-us-west-h100-80gb-spot"
CPU_US_WEST = "demo-us-west-cpu-on-demand"
LIVE_PHASES = ("Pending", "Running")


def start_sandbox(
    settings, tmp_path: Path, pools: dict[str, int], *, request_timeout: int = 2
) -> SandboxCluster:
    """The demo catalog, and a started sandbox cluster with `pools[slug]` nodes of each
    named demo pool; the console's Kubernetes backend talks to it through the official
    client, and the pools are synced from it. The caller stops it."""
    seed_catalog()
    chosen = list(
        NodePool.objects.filter(slug__in=list(pools))
        .select_related("region", "gpu_type")
        .order_by("slug")
    )
    assert {pool.slug for pool in chosen} == set(pools), "a demo pool is missing"
    for pool in chosen:
        pool.node_count = pools[pool.slug]
    cluster = SandboxCluster(
        sandbox_nodes(chosen), token=TOKEN, tick_seconds=0.05, pod_start_delay=0
    ).start()
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text("[]")  # present: write_sandbox_files keeps it
    write_sandbox_files(
        nodes_file=nodes_file,
        kubeconfig_file=tmp_path / "kubeconfig",
        url=cluster.server.url,
        token=TOKEN,
    )
    settings.SANDBOX_URL = cluster.server.url
    settings.SANDBOX_TOKEN = TOKEN
    settings.KUBECONFIG = str(tmp_path / "kubeconfig")
    settings.PROMETHEUS_URL = f"{cluster.server.url}/prometheus"
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    settings.KUBERNETES_REQUEST_TIMEOUT = request_timeout
    namespaces_forget_all()  # a fresh cluster: no namespace of an earlier test exists
    capacity_sync(backend=get_backend("kubernetes"))
    return cluster


def namespace_of(job: Job) -> str:
    return manifests.namespace_name(job.tenant_id)


def job_selector(job: Job) -> str:
    return f"{manifests.JOB_LABEL}={job.pk}"


def is_true(obj: dict, kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def live_pods(server, job: Job) -> list[dict]:
    pods = server.list("pods", namespace_of(job), label_selector=job_selector(job))
    return [p for p in pods if (p.get("status") or {}).get("phase") in LIVE_PHASES]


def cluster_state(server, job: Job) -> str:
    """What the cluster says of a job, in the console's words: `running` (every rank of
    the current attempt Running, not suspended), `succeeded` (every tier Job Complete),
    `paused` (suspended, no pod left), `gone` (no Job and no pod of any attempt),
    `failed`, or `transient` (on its way between these)."""
    ns = namespace_of(job)
    kube_jobs = server.list("jobs", ns, label_selector=job_selector(job))
    live = live_pods(server, job)
    if not kube_jobs:
        return "gone" if not live else "transient"
    current = [
        j
        for j in kube_jobs
        if j["metadata"]["labels"].get(manifests.ATTEMPT_LABEL) == str(job.attempt)
    ]
    if len(current) != len(kube_jobs) or len(current) != len(manifests.tiers(job)):
        return "transient"
    if any(is_true(j, "Failed") for j in current):
        return "failed"
    if all(is_true(j, "Complete") for j in current):
        return "succeeded"
    suspended = [bool(j["spec"].get("suspend")) for j in current]
    if all(suspended):
        return "paused" if not live else "transient"
    running = [p for p in live if p["status"]["phase"] == "Running"]
    if not any(suspended) and len(running) == len(live) == job.nodes:
        return "running"
    return "transient"


def report(line: str) -> None:
    """Print a test's line of counts and hand it to the session's terminal summary
    (tests/faults/conftest.py)."""
    print(line, flush=True)
    REPORTED.append(line)


# What each console status must be backed by in the cluster.
AGREES = {"running": "running", "succeeded": "succeeded", "paused": "paused", "cancelled": "gone"}


@dataclass
class StoreLedger:
    """Every batch/v1 Job and pod the simulated API server ever stored (by wrapping its
    store's insert), and the most live pods it ever saw at once for one rank."""

    jobs: Counter = field(default_factory=Counter)  # (namespace, name) -> times stored
    job_labels: dict[tuple[str, str], dict] = field(default_factory=dict)
    pods: int = 0
    most_live_per_rank: int = 0

    def install(self, server) -> StoreLedger:
        original = server._insert

        def recording_insert(rt, obj):
            stored = original(rt, obj)
            meta = stored["metadata"]
            if rt.key == "jobs.batch":
                key = (meta.get("namespace") or "", meta["name"])
                self.jobs[key] += 1
                self.job_labels[key] = dict(meta.get("labels") or {})
            elif rt.key == "pods":
                self.pods += 1
            return stored

        server._insert = recording_insert
        return self

    def check_ranks(self, server) -> None:
        """Note the most live pods of one (job, attempt, tier, completion index) now."""
        per_rank: Counter = Counter()
        for pod in server.list("pods"):
            if (pod.get("status") or {}).get("phase") not in LIVE_PHASES:
                continue
            labels = pod["metadata"].get("labels") or {}
            if manifests.JOB_LABEL not in labels:
                continue
            annotations = pod["metadata"].get("annotations") or {}
            index = annotations.get(
                manifests.COMPLETION_INDEX, labels.get(manifests.COMPLETION_INDEX)
            )
            per_rank[
                (
                    labels[manifests.JOB_LABEL],
                    labels.get(manifests.ATTEMPT_LABEL),
                    labels.get(manifests.TIER_LABEL),
                    index,
                )
            ] += 1
        self.most_live_per_rank = max([self.most_live_per_rank, *per_rank.values()])

    def doubled_jobs(self) -> list[tuple[str, str]]:
        """Kubernetes Jobs stored more than once under one name (one attempt and tier)."""
        return sorted(key for key, times in self.jobs.items() if times > 1)


@dataclass
class FaultTally:
    """Kubernetes API requests the server received, and how many got an injected fault."""

    calls: int = 0
    failed: int = 0
    slowed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, server) -> FaultTally:
        original = server._take_fault

        def counting(method: str, path: str):
            fault = original(method, path)
            with self._lock:
                self.calls += 1
                if fault is not None:
                    if fault.kind == "delay":
                        self.slowed += 1
                    else:
                        self.failed += 1
            return fault

        server._take_fault = counting
        return self


class InProcessWorker:
    """A Celery worker in threads: tasks queued by name (console.queueing) land here
    instead of the broker, and `threads` threads run them as the worker would, each with
    its own database connection. An error the task retries (its `autoretry_for`) is retried
    with backoff, compressed in time (0.2 s doubling to 2 s, jittered) and bounded by
    `max_tries`; any other error is kept in `errors`."""

    def __init__(self, *, threads: int = 2, max_tries: int = 200, seed: int = 15) -> None:

        app.loader.import_default_modules()  # the worker's autodiscovery
        self.app = app
        self.max_tries = max_tries
        self.errors: list[str] = []
        self.ran = 0
        self.retried = 0
        self.gave_up: list[str] = []
        self._heap: list[tuple[float, int, str, tuple, int]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._running = 0
        self._stop = threading.Event()
        self._random = random.Random(seed)
        self._threads = [
            threading.Thread(target=self._serve, name=f"faults-worker-{n}", daemon=True)
            for n in range(threads)
        ]

    def send(self, task, args: tuple, countdown: float | None) -> None:
        """The broker's part (`tests.broker.broker_replaced`)."""
        self._push(task.name, args, tries=0, delay=countdown or 0.0)

    def _push(self, name: str, args: tuple, *, tries: int, delay: float) -> None:
        with self._cond:
            heapq.heappush(
                self._heap, (time.monotonic() + delay, next(self._order), name, args, tries)
            )
            self._cond.notify()

    def start(self) -> InProcessWorker:
        for thread in self._threads:
            thread.start()
        return self

    def idle(self) -> bool:
        with self._cond:
            return not self._heap and not self._running

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self._threads), "a worker thread never finished"

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    if not self._heap or self._heap[0][0] > time.monotonic():
                        wait = self._heap[0][0] - time.monotonic() if self._heap else 0.2
                        self._cond.wait(timeout=max(0.01, min(wait, 0.2)))
                        continue
                    _, _, name, args, tries = heapq.heappop(self._heap)
                    self._running += 1
                try:
                    self._run(name, args, tries)
                finally:
                    with self._cond:
                        self._running -= 1
        finally:
            connection.close()

    def _run(self, name: str, args: tuple, tries: int) -> None:
        task = self.app.tasks[name]
        try:
            run_body(task, args)
            with self._cond:
                self.ran += 1
        except tuple(getattr(task, "autoretry_for", ()) or ()) as error:
            if tries + 1 >= self.max_tries:
                self.gave_up.append(f"{name}{args}: {error}")
                return
            with self._cond:
                self.retried += 1
                delay = min(0.2 * 2**tries, 2.0) * self._random.uniform(0.5, 1.0)
            self._push(name, args, tries=tries + 1, delay=delay)
        except Exception:
            self.errors.append(f"{name}{args}:\n{traceback.format_exc()}")


class Loop(threading.Thread):
    """Call `body` every `every` seconds in a thread (with its own database connection)
    until stopped; keeps what it raised."""

    def __init__(self, name: str, body: Callable[[], Any], every: float) -> None:
        super().__init__(name=name, daemon=True)
        self.body, self.every = body, every
        self.passes = 0
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self.body()
                    self.passes += 1
                except Exception:
                    self.errors.append(traceback.format_exc())
                self.stopping.wait(self.every)
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
        assert not self.is_alive(), f"{self.name} never finished"
