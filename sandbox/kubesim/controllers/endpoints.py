"""The Endpoints controller: for each Service with a selector, an Endpoints object of
the same name lists its selected pods' IPs (ready ones in ``addresses``, the others in
``notReadyAddresses``) and the target ports, so a client finds the ready pods of a
Service as it would in a cluster. Endpoints it made for a Service that is gone (or lost
its selector) are deleted."""

from __future__ import annotations

from typing import Any

from sandbox.kubesim.conditions import TERMINAL_PHASES, is_true
from sandbox.kubesim.selectors import label_selector_from_dict
from sandbox.kubesim.store import Store

#: The label the real controller puts on the Endpoints it manages.
MANAGED_LABEL = "endpointslice.kubernetes.io/skip-mirror"


def _target_port(port: dict, pods: list[dict]) -> int | None:
    """A Service port's target as a number: a number, or a container port's name."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    if str(target).isdigit():
        return int(target)
    for pod in pods:
        for container in pod["spec"].get("containers") or []:
            for p in container.get("ports") or []:
                if p.get("name") == target:
                    return int(p["containerPort"])
    return None


class EndpointsController(Store):
    """One pass over every Service and the Endpoints made for them."""

    def _endpoints_pass(self) -> None:
        srt, ert, prt = self._by_key["services"], self._by_key["endpoints"], self._by_key["pods"]
        selecting = set()
        for service in self._objects(srt):
            meta = service["metadata"]
            selector = (service.get("spec") or {}).get("selector")
            if not selector:
                continue
            selecting.add((meta["namespace"], meta["name"]))
            preds = label_selector_from_dict({"matchLabels": selector})
            pods = [
                p
                for p in self._objects(prt, meta["namespace"])
                if p["status"].get("phase") not in TERMINAL_PHASES
                and p["status"].get("podIP")
                and all(pred(p["metadata"].get("labels") or {}) for pred in preds)
            ]
            want = {
                "metadata": {
                    "name": meta["name"],
                    "labels": {**(meta.get("labels") or {}), MANAGED_LABEL: "true"},
                },
                **self._subsets(service, pods),
            }
            current = self._get(ert, meta["namespace"], meta["name"])
            if current is None:
                self._create(ert, meta["namespace"], want)
                continue

            def write(e: dict, want: dict = want) -> None:
                e["metadata"]["labels"] = want["metadata"]["labels"]
                e.pop("subsets", None)
                if "subsets" in want:
                    e["subsets"] = want["subsets"]

            self._modify(ert, current, write)
        for endpoints in self._objects(ert):
            meta = endpoints["metadata"]
            managed = (meta.get("labels") or {}).get(MANAGED_LABEL) == "true"
            if managed and (meta["namespace"], meta["name"]) not in selecting:
                self._delete(ert, endpoints)

    @staticmethod
    def _subsets(service: dict, pods: list[dict]) -> dict[str, Any]:
        ports = []
        for port in (service.get("spec") or {}).get("ports") or []:
            number = _target_port(port, pods)
            if number is not None:
                entry = {"port": number, "protocol": port.get("protocol", "TCP")}
                if port.get("name"):
                    entry["name"] = port["name"]
                ports.append(entry)
        ready, not_ready = [], []
        for pod in pods:
            address = {
                "ip": pod["status"]["podIP"],
                "nodeName": pod["spec"].get("nodeName"),
                "targetRef": {
                    "kind": "Pod",
                    "namespace": pod["metadata"]["namespace"],
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            }
            (ready if is_true(pod, "Ready") else not_ready).append(address)
        if not ready and not not_ready:
            return {}
        subset: dict[str, Any] = {"ports": ports}
        if ready:
            subset["addresses"] = ready
        if not_ready:
            subset["notReadyAddresses"] = not_ready
        return {"subsets": [subset]}
