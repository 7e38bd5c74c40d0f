"""The ReplicaSet controller (apps/v1): keeps as many live pods of each ReplicaSet as its
``spec.replicas`` (named ``<replicaset>-<5 random characters>``, owned by it), deleting
the least useful first when there are too many (not scheduled, not running, not ready,
then the newest), and keeps its status counts. Its pods go through the scheduler and
kubelet like any other; they serve HTTP (see controllers.serving)."""

from __future__ import annotations

import copy
from typing import Any

from sandbox.kubesim.conditions import TERMINAL_PHASES, get_condition, set_condition
from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.resources import ResourceType
from sandbox.kubesim.store import Store

_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def controlled_by(objects: list[dict], uid: str) -> list[dict]:
    """The objects whose controller owner reference points at ``uid``."""
    return [
        o
        for o in objects
        if any(
            r.get("uid") == uid and r.get("controller")
            for r in o["metadata"].get("ownerReferences") or []
        )
    ]


def owner_reference(owner: dict) -> dict:
    """The controller owner reference of an object ``owner`` creates."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def _deletion_cost(pod: dict) -> int:
    try:
        return int(((pod["metadata"].get("annotations") or {}).get(DELETION_COST)) or 0)
    except ValueError:
        return 0


class ReplicaSetsController(Store):
    """One pass over every ReplicaSet: its pods, then its status."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rs_create_errors: dict[str, str] = {}  # the last FailedCreate, by RS uid

    def _forget(self, rt: ResourceType, obj: dict) -> None:
        super()._forget(rt, obj)
        if rt.key == "replicasets.apps":
            self._rs_create_errors.pop(obj["metadata"]["uid"], None)

    def _is_available(self, pod: dict, min_ready_seconds: int) -> bool:
        """Ready for at least ``min_ready_seconds``, as the controllers count availability."""
        ready = get_condition(pod, "Ready")
        if not ready or ready.get("status") != "True":
            return False
        since = self._parse_ts(ready.get("lastTransitionTime")) or 0.0
        return min_ready_seconds <= 0 or self._now() >= since + min_ready_seconds

    def _live_pods(self, owner: dict) -> list[dict]:
        pods = self._objects(self._by_key["pods"], owner["metadata"]["namespace"])
        # A terminating pod (deleted, serving out its preStop sleep) is no replica any more.
        return [
            p
            for p in controlled_by(pods, owner["metadata"]["uid"])
            if p["status"].get("phase") not in TERMINAL_PHASES
            and not p["metadata"].get("deletionTimestamp")
        ]

    def _deletion_rank(self, pod: dict) -> tuple:
        """Sorts the pods to delete first to the front (as ActivePodsWithRanks: not
        scheduled, pending, not ready, lowest pod-deletion-cost, newest)."""
        ready = get_condition(pod, "Ready") or {}
        return (
            bool((pod.get("spec") or {}).get("nodeName")),
            _PHASE_RANK.get(pod["status"].get("phase", ""), 1),
            ready.get("status") == "True",
            _deletion_cost(pod),
            -(self._parse_ts(pod["metadata"].get("creationTimestamp")) or 0.0),
            -int(pod["metadata"]["resourceVersion"]),
        )

    def _replicasets_pass(self) -> None:
        rsrt, prt = self._by_key["replicasets.apps"], self._by_key["pods"]
        plans = [(rs, self._live_pods(rs)) for rs in self._objects(rsrt)]
        # Deletions first: a rollout never holds more pods than it allows, even for a moment.
        for rs, pods in plans:
            excess = len(pods) - rs["spec"]["replicas"]
            for pod in sorted(pods, key=self._deletion_rank)[: max(0, excess)]:
                self._delete(prt, pod)
                self._emit(
                    rsrt, rs, "Normal", "SuccessfulDelete",
                    f"Deleted pod: {pod['metadata']['name']}", "replicaset-controller",
                )  # fmt: skip
        for rs, pods in plans:
            for _ in range(rs["spec"]["replicas"] - len(pods)):
                if not self._create_replica(rs):
                    break
        for rs in self._objects(rsrt):
            self._replicaset_status(rs)

    def _create_replica(self, rs: dict) -> bool:
        """Create one pod of ``rs``; False (and a FailedCreate event) if refused."""
        rsrt = self._by_key["replicasets.apps"]
        template = copy.deepcopy(rs["spec"]["template"])
        tmeta = template.get("metadata") or {}
        meta: dict[str, Any] = {
            "generateName": f"{rs['metadata']['name']}-",
            "labels": dict(tmeta.get("labels") or {}),
            "ownerReferences": [owner_reference(rs)],
        }
        if tmeta.get("annotations"):
            meta["annotations"] = dict(tmeta["annotations"])
        uid = rs["metadata"]["uid"]
        try:
            pod = self._create(
                self._by_key["pods"],
                rs["metadata"]["namespace"],
                {"metadata": meta, "spec": template["spec"]},
            )
        except ApiError as error:
            message = f"Error creating: {error.message}"
            if self._rs_create_errors.get(uid) != message:
                self._rs_create_errors[uid] = message
                self._emit(rsrt, rs, "Warning", "FailedCreate", message, "replicaset-controller")
            return False
        self._rs_create_errors.pop(uid, None)
        self._emit(
            rsrt, rs, "Normal", "SuccessfulCreate",
            f"Created pod: {pod['metadata']['name']}", "replicaset-controller",
        )  # fmt: skip
        return True

    def _replicaset_status(self, rs: dict) -> None:
        pods = self._live_pods(rs)
        min_ready = rs["spec"].get("minReadySeconds", 0)
        selector_labels = (rs["spec"].get("selector") or {}).get("matchLabels") or {}
        status: dict[str, Any] = {
            "replicas": len(pods),
            "fullyLabeledReplicas": sum(
                1
                for p in pods
                if selector_labels.items() <= (p["metadata"].get("labels") or {}).items()
            ),
            "readyReplicas": sum(1 for p in pods if self._is_available(p, 0)),
            "availableReplicas": sum(1 for p in pods if self._is_available(p, min_ready)),
            "observedGeneration": rs["metadata"].get("generation", 1),
        }
        for key in ("fullyLabeledReplicas", "readyReplicas", "availableReplicas"):
            if not status[key]:
                del status[key]
        conds = copy.deepcopy((rs.get("status") or {}).get("conditions") or [])
        failure = self._rs_create_errors.get(rs["metadata"]["uid"])
        if failure:
            set_condition(conds, "ReplicaFailure", "True", "FailedCreate", failure, self._ts())
        else:
            conds = [c for c in conds if c.get("type") != "ReplicaFailure"]
        if conds:
            status["conditions"] = conds

        def write(o: dict) -> None:
            o["status"] = status

        self._modify(self._by_key["replicasets.apps"], rs, write)
