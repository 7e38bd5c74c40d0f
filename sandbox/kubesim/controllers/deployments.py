"""The Deployment controller (apps/v1): one ReplicaSet per pod template, named
``<deployment>-<pod-template-hash>`` (the hash also labels its selector and pods, as the
real controller does); a rolling update scales the new ReplicaSet up and the old ones
down within ``maxSurge`` pods above ``replicas`` and ``maxUnavailable`` below it,
counting available pods (Recreate: old ones to zero first); old ReplicaSets stay at
zero up to ``revisionHistoryLimit``. Keeps the ``deployment.kubernetes.io/revision``
annotations, the status counts and the Available and Progressing conditions."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any

from sandbox.kubesim.controllers.replicasets import (
    ReplicaSetsController,
    controlled_by,
    owner_reference,
)

REVISION = "deployment.kubernetes.io/revision"
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
HASH_LABEL = "pod-template-hash"
_HASH_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet the real hash is written in


def template_hash(template: dict) -> str:
    """A stable name-safe hash of a pod template (the real controller's is FNV-based)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(_HASH_CHARS[b % len(_HASH_CHARS)] for b in digest[:10])


def _int_or_percent(value: int | str, total: int, *, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    share = total * int(str(value).rstrip("%")) / 100
    return math.ceil(share) if round_up else math.floor(share)


def rolling_bounds(deployment: dict) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) in pods; both zero would deadlock, so unavailable is 1
    then. Recreate surges nothing and may lose every pod."""
    spec = deployment["spec"]
    replicas = spec["replicas"]
    strategy = spec.get("strategy") or {}
    if strategy.get("type") != "RollingUpdate":
        return 0, replicas
    rolling = strategy.get("rollingUpdate") or {}
    surge = _int_or_percent(rolling.get("maxSurge", "25%"), replicas, round_up=True)
    unavailable = _int_or_percent(rolling.get("maxUnavailable", "25%"), replicas, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def _revision(rs: dict) -> int:
    return int((rs["metadata"].get("annotations") or {}).get(REVISION) or 0)


def _set_condition(
    conds: list[dict], ctype: str, status: str, reason: str, message: str, ts: str
) -> None:
    """A Deployment condition: ``lastUpdateTime`` moves on any change,
    ``lastTransitionTime`` when the status flips."""
    found = next((c for c in conds if c["type"] == ctype), None)
    if found is None:
        found = {"type": ctype, "lastTransitionTime": ts}
        conds.append(found)
    elif found["status"] != status:
        found["lastTransitionTime"] = ts
    if (found.get("status"), found.get("reason"), found.get("message")) != (
        status,
        reason,
        message,
    ):
        found.update(status=status, reason=reason, message=message, lastUpdateTime=ts)


class DeploymentsController(ReplicaSetsController):
    """One pass over every Deployment: its ReplicaSets, then its status."""

    def _deployments_pass(self) -> None:
        for deployment in self._objects(self._by_key["deployments.apps"]):
            self._sync_deployment(deployment)

    def _scale_replicaset(self, deployment: dict, rs: dict, replicas: int) -> dict:
        """Set a ReplicaSet's replicas (and the annotations that go with them)."""
        before = rs["spec"]["replicas"]
        surge, _ = rolling_bounds(deployment)
        desired = deployment["spec"]["replicas"]

        def scale(o: dict) -> None:
            o["spec"]["replicas"] = replicas
            notes = o["metadata"].setdefault("annotations", {})
            notes[DESIRED_REPLICAS] = str(desired)
            notes[MAX_REPLICAS] = str(desired + surge)

        scaled = self._modify(self._by_key["replicasets.apps"], rs, scale)
        if replicas != before:
            way = "up" if replicas > before else "down"
            self._emit(
                self._by_key["deployments.apps"], deployment, "Normal", "ScalingReplicaSet",
                f"Scaled {way} replica set {rs['metadata']['name']} from {before} to {replicas}",
                "deployment-controller",
            )  # fmt: skip
        return scaled

    def _new_replicaset(self, deployment: dict, pod_hash: str, revision: int) -> dict:
        spec = deployment["spec"]
        template = copy.deepcopy(spec["template"])
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), HASH_LABEL: pod_hash}
        selector = copy.deepcopy(spec["selector"])
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), HASH_LABEL: pod_hash}
        surge, _ = rolling_bounds(deployment)
        name = f"{deployment['metadata']['name']}-{pod_hash}"
        rs = {
            "metadata": {
                "name": name,
                "labels": dict(tmeta["labels"]),
                "annotations": {
                    REVISION: str(revision),
                    DESIRED_REPLICAS: str(spec["replicas"]),
                    MAX_REPLICAS: str(spec["replicas"] + surge),
                },
                "ownerReferences": [owner_reference(deployment)],
            },
            "spec": {
                "replicas": 0,
                "minReadySeconds": spec.get("minReadySeconds", 0),
                "selector": selector,
                "template": template,
            },
        }
        created = self._create(
            self._by_key["replicasets.apps"], deployment["metadata"]["namespace"], rs
        )
        self._emit(
            self._by_key["deployments.apps"], deployment, "Normal", "ScalingReplicaSet",
            f"Created new replica set {name}", "deployment-controller",
        )  # fmt: skip
        return created

    def _sync_deployment(self, deployment: dict) -> None:
        rsrt = self._by_key["replicasets.apps"]
        spec = deployment["spec"]
        owned = controlled_by(
            self._objects(rsrt, deployment["metadata"]["namespace"]),
            deployment["metadata"]["uid"],
        )
        pod_hash = template_hash(spec["template"])
        new = next(
            (rs for rs in owned if rs["metadata"]["labels"].get(HASH_LABEL) == pod_hash), None
        )
        olds = sorted((rs for rs in owned if rs is not new), key=_revision)
        latest = max((_revision(rs) for rs in owned), default=0)
        created = new is None
        if new is None:
            new = self._new_replicaset(deployment, pod_hash, latest + 1)
        elif olds and _revision(new) < latest:  # rolled back to an older template

            def bump(o: dict) -> None:
                o["metadata"]["annotations"][REVISION] = str(latest + 1)

            new = self._modify(rsrt, new, bump)
        replicas = spec["replicas"]
        surge, unavailable = rolling_bounds(deployment)
        if spec["strategy"]["type"] == "Recreate":
            for old in olds:
                if old["spec"]["replicas"]:
                    self._scale_replicaset(deployment, old, 0)
            if not any(self._live_pods(old) for old in olds):
                new = self._scale_replicaset(deployment, new, replicas)
        else:
            have = new["spec"]["replicas"]
            target = replicas
            if have < replicas:
                in_all = have + sum(old["spec"]["replicas"] for old in olds)
                target = have + max(0, min(replicas + surge - in_all, replicas - have))
            new = self._scale_replicaset(deployment, new, target)
            self._scale_down_olds(deployment, new, olds, replicas - unavailable)
        self._drop_old_history(deployment, olds)
        self._deployment_status(deployment, new, created)

    def _scale_down_olds(
        self, deployment: dict, new: dict, olds: list[dict], min_available: int
    ) -> None:
        """Scale the old ReplicaSets down as far as availability allows: first their
        pods that aren't available, then available ones down to ``min_available``."""
        olds = [old for old in olds if old["spec"]["replicas"]]
        if not olds:
            return
        min_ready = deployment["spec"].get("minReadySeconds", 0)

        def available(rs: dict) -> int:
            return sum(1 for p in self._live_pods(rs) if self._is_available(p, min_ready))

        in_all = new["spec"]["replicas"] + sum(old["spec"]["replicas"] for old in olds)
        new_unavailable = new["spec"]["replicas"] - available(new)
        budget = in_all - min_available - new_unavailable
        if budget <= 0:
            return
        kept = []
        for old in olds:
            unhealthy = old["spec"]["replicas"] - available(old)
            cut = min(budget, max(0, unhealthy))
            if cut:
                budget -= cut
                old = self._scale_replicaset(deployment, old, old["spec"]["replicas"] - cut)
            kept.append(old)
        excess = available(new) + sum(available(old) for old in kept) - min_available
        for old in kept:
            cut = min(old["spec"]["replicas"], max(0, excess))
            if cut:
                excess -= cut
                self._scale_replicaset(deployment, old, old["spec"]["replicas"] - cut)

    def _drop_old_history(self, deployment: dict, olds: list[dict]) -> None:
        """Delete the oldest empty old ReplicaSets beyond ``revisionHistoryLimit``."""
        rsrt = self._by_key["replicasets.apps"]
        empty = []
        for old in olds:
            current = self._get(rsrt, old["metadata"]["namespace"], old["metadata"]["name"])
            if current and not current["spec"]["replicas"] and not self._live_pods(current):
                empty.append(current)
        limit = deployment["spec"].get("revisionHistoryLimit", 10)
        for old in empty[: max(0, len(empty) - limit)]:
            self._delete(rsrt, old)

    def _deployment_status(self, deployment: dict, new: dict, created: bool) -> None:
        drt, rsrt = self._by_key["deployments.apps"], self._by_key["replicasets.apps"]
        ns, uid = deployment["metadata"]["namespace"], deployment["metadata"]["uid"]
        owned = controlled_by(self._objects(rsrt, ns), uid)
        min_ready = deployment["spec"].get("minReadySeconds", 0)
        pods = [p for rs in owned for p in self._live_pods(rs)]
        replicas = deployment["spec"]["replicas"]
        counts = {
            "replicas": len(pods),
            "updatedReplicas": len(self._live_pods(new)),
            "readyReplicas": sum(1 for p in pods if self._is_available(p, 0)),
            "availableReplicas": sum(1 for p in pods if self._is_available(p, min_ready)),
            "unavailableReplicas": max(
                0,
                sum(rs["spec"]["replicas"] for rs in owned)
                - sum(1 for p in pods if self._is_available(p, min_ready)),
            ),
        }
        old_status = deployment.get("status") or {}
        status: dict[str, Any] = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            **{k: v for k, v in counts.items() if v},
        }
        ts, now = self._ts(), self._now()
        conds = copy.deepcopy(old_status.get("conditions") or [])
        _, unavailable = rolling_bounds(deployment)
        if counts["availableReplicas"] >= replicas - unavailable:
            _set_condition(
                conds, "Available", "True", "MinimumReplicasAvailable",
                "Deployment has minimum availability.", ts,
            )  # fmt: skip
        else:
            _set_condition(
                conds, "Available", "False", "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.", ts,
            )  # fmt: skip
        name = new["metadata"]["name"]
        complete = (
            counts["updatedReplicas"] == replicas == counts["replicas"]
            and counts["availableReplicas"] == replicas
        )
        progressing = next((c for c in conds if c["type"] == "Progressing"), None)
        moved = any(old_status.get(k, 0) != v for k, v in counts.items())
        if complete:
            _set_condition(
                conds, "Progressing", "True", "NewReplicaSetAvailable",
                f'ReplicaSet "{name}" has successfully progressed.', ts,
            )  # fmt: skip
        elif created:
            _set_condition(
                conds, "Progressing", "True", "NewReplicaSetCreated",
                f'Created new replica set "{name}"', ts,
            )  # fmt: skip
        elif moved or progressing is None or progressing["reason"] == "NewReplicaSetAvailable":
            _set_condition(
                conds, "Progressing", "True", "ReplicaSetUpdated",
                f'ReplicaSet "{name}" is progressing.', ts,
            )  # fmt: skip
            if progressing is not None:
                progressing["lastUpdateTime"] = ts
        elif (self._parse_ts(progressing.get("lastUpdateTime")) or now) + deployment["spec"].get(
            "progressDeadlineSeconds", 600
        ) < now:
            _set_condition(
                conds, "Progressing", "False", "ProgressDeadlineExceeded",
                f'ReplicaSet "{name}" has timed out progressing.', ts,
            )  # fmt: skip
        status["conditions"] = conds
        revision = (new["metadata"].get("annotations") or {}).get(REVISION)

        def write(d: dict) -> None:
            d["status"] = status
            if revision:
                d["metadata"].setdefault("annotations", {})[REVISION] = revision

        current = self._get(drt, ns, deployment["metadata"]["name"])
        if current is not None and current["metadata"]["uid"] == uid:
            self._modify(drt, current, write)
