"""A small Kueue (kueue.x-k8s.io/v1beta1): Workloads for queued Jobs and JobSets,
admitted (the object unsuspended) while their queues exist and ``kueue_admits``,
evicted (suspended again) when deactivated. No quota arithmetic: tests and the
sandbox decide by holding it."""

from __future__ import annotations

from sandbox.kubesim.conditions import is_finished, is_true, set_condition
from sandbox.kubesim.resources import ResourceType
from sandbox.kubesim.store import Store


class KueueController(Store):
    """Kueue's admission of Jobs and JobSets labelled ``kueue.x-k8s.io/queue-name``."""

    #: Whether the fake Kueue admits what its queues hold (a test holds it to see a wait).
    kueue_admits = True
    #: Why it doesn't, as Kueue would put it in the Workload's QuotaReserved condition.
    kueue_hold_message = "couldn't assign flavors to pod set main: insufficient unused quota"

    def install_kueue(self) -> None:
        """Serve Kueue's API (kueue.x-k8s.io/v1beta1) with a small admission controller:
        a Job or JobSet labelled `kueue.x-k8s.io/queue-name` gets a Workload (labelled
        with its uid); while its LocalQueue and that queue's ClusterQueue exist and
        `kueue_admits`, the active Workload is admitted and the object unsuspended, all
        its pod sets at once; a deactivated one (`spec.active: false`) is evicted and
        the object suspended again. No quota arithmetic: tests decide by holding it."""
        for plural, kind, namespaced in (
            ("clusterqueues", "ClusterQueue", False),
            ("localqueues", "LocalQueue", True),
            ("workloads", "Workload", True),
            ("resourceflavors", "ResourceFlavor", False),
            ("workloadpriorityclasses", "WorkloadPriorityClass", False),
        ):
            self.register_resource(
                ResourceType("kueue.x-k8s.io", "v1beta1", plural, kind, namespaced)
            )

    def _kueue_pass(self) -> None:
        wl_rt = self._by_key.get("workloads.kueue.x-k8s.io")
        if wl_rt is None:
            return
        owners = [
            (self._by_key["jobs.batch"], o) for o in self._objects(self._by_key["jobs.batch"])
        ]
        js_rt = self._by_key.get("jobsets.jobset.x-k8s.io")
        if js_rt is not None:
            owners += [(js_rt, o) for o in self._objects(js_rt)]
        for rt, obj in owners:
            meta = obj["metadata"]
            queue = (meta.get("labels") or {}).get("kueue.x-k8s.io/queue-name")
            if not queue or meta.get("deletionTimestamp") or is_finished(obj):
                continue
            ns, uid = meta["namespace"], meta["uid"]
            workload = next(
                (
                    w
                    for w in self._objects(wl_rt, ns)
                    if (w["metadata"].get("labels") or {}).get("kueue.x-k8s.io/job-uid") == uid
                ),
                None,
            )
            if workload is None:
                workload = self._create(wl_rt, ns, self._workload_for(rt, obj, queue))
            active = (workload.get("spec") or {}).get("active", True)
            admitted = is_true(workload, "Admitted")
            ts = self._ts()
            if active and not admitted:
                blocker = self._kueue_blocker(ns, queue)

                def wait_or_admit(w: dict, blocker: str | None = blocker, ts: str = ts) -> None:
                    conds = w.setdefault("status", {}).setdefault("conditions", [])
                    if blocker:
                        set_condition(conds, "QuotaReserved", "False", "Pending", blocker, ts)
                        return
                    set_condition(conds, "QuotaReserved", "True", "QuotaReserved", "", ts)
                    set_condition(conds, "Admitted", "True", "Admitted", "", ts)
                    w["status"]["conditions"] = [c for c in conds if c["type"] != "Evicted"]

                workload = self._modify(wl_rt, workload, wait_or_admit)
                if not blocker:
                    self._modify(rt, obj, lambda o: o["spec"].update(suspend=False))
            elif not active and admitted:

                def evict(w: dict, ts: str = ts) -> None:
                    conds = w.setdefault("status", {}).setdefault("conditions", [])
                    conds[:] = [c for c in conds if c["type"] not in ("Admitted", "QuotaReserved")]
                    set_condition(
                        conds, "Evicted", "True", "Deactivated", "The workload is deactivated", ts
                    )

                self._modify(wl_rt, workload, evict)
                self._modify(rt, obj, lambda o: o["spec"].update(suspend=True))

    def _workload_for(self, rt: ResourceType, obj: dict, queue: str) -> dict:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        if rt.kind == "JobSet":
            pod_sets = [
                {
                    "name": rj["name"],
                    "count": int(rj.get("replicas", 1))
                    * int((rj.get("template") or {}).get("spec", {}).get("parallelism", 1)),
                }
                for rj in spec.get("replicatedJobs") or []
            ]
        else:
            pod_sets = [{"name": "main", "count": int(spec.get("parallelism", 1))}]
        return {
            "metadata": {
                "name": f"{rt.kind.lower()}-{meta['name']}-{meta['uid'][:5]}",
                "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": rt.api_version,
                        "kind": rt.kind,
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"queueName": queue, "active": True, "podSets": pod_sets},
        }

    def _kueue_blocker(self, ns: str, queue: str) -> str | None:
        local = self._get(self._by_key["localqueues.kueue.x-k8s.io"], ns, queue)
        if local is None:
            return f"LocalQueue {queue} doesn't exist"
        cluster_queue = (local.get("spec") or {}).get("clusterQueue", "")
        if self._get(self._by_key["clusterqueues.kueue.x-k8s.io"], None, cluster_queue) is None:
            return f"ClusterQueue {cluster_queue} doesn't exist"
        return None if self.kueue_admits else self.kueue_hold_message
