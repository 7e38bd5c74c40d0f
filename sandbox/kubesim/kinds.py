"""Per-kind defaulting and validation, as the API server's registry strategies do it:
``_prepare_<kind>(rt, obj, old)`` runs on create (``old`` None) and on update, before
the object is admitted and stored."""

from __future__ import annotations

import base64
import copy

from sandbox.kubesim.admission import Admission
from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.resources import ResourceType, format_quantity, parse_quantity
from sandbox.kubesim.selectors import label_selector_from_dict
from sandbox.kubesim.validation import invalid

#: What a Deployment's RollingUpdate strategy defaults to, as apps/v1 does.
DEFAULT_ROLLING_UPDATE = {"maxSurge": "25%", "maxUnavailable": "25%"}


class KindHooks(Admission):
    """Defaults and immutability rules of namespaces, nodes, pods, Jobs, Deployments,
    ReplicaSets, HorizontalPodAutoscalers, Services, Secrets, Events and ResourceQuotas."""

    def _prepare_namespace(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        meta = obj["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), "kubernetes.io/metadata.name": meta["name"]}
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        if old is None:
            obj["status"] = {"phase": "Active"}

    def _prepare_priorityclass(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        """As the scheduling API validates a PriorityClass: an integer value, at most one
        billion outside the system classes, that can't change afterwards."""
        name = obj["metadata"]["name"]
        value = obj.get("value")
        if not isinstance(value, int) or isinstance(value, bool):
            raise invalid(rt, name, "value", value, "Required value")
        if value > 1_000_000_000 and not name.startswith("system-"):
            raise invalid(rt, name, "value", value, "must not be greater than 1000000000")
        if old is not None and old.get("value") != value:
            raise invalid(rt, name, "value", value, "field is immutable")
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
        obj.setdefault("globalDefault", False)

    def _resolve_priority(self, name: str, spec: dict) -> None:
        """The Priority admission plugin: a pod naming a PriorityClass gets its value and
        preemption policy, and one naming a class that doesn't exist is forbidden (the
        Job controller then records FailedCreate)."""
        class_name = spec.get("priorityClassName")
        if not class_name:
            spec.setdefault("priority", 0)
            return
        found = self._get(self._by_key["priorityclasses.scheduling.k8s.io"], None, class_name)
        if found is None:
            raise ApiError(
                403,
                f'pods "{name}" is forbidden: no PriorityClass with name {class_name} was found',
                details={"name": name, "kind": "pods"},
            )
        spec["priority"] = found["value"]
        spec["preemptionPolicy"] = found.get("preemptionPolicy", "PreemptLowerPriority")

    def _prepare_node(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        if old is None:
            st = obj.setdefault("status", {})
            st.setdefault("capacity", {})
            st.setdefault("allocatable", dict(st["capacity"]))
            st.setdefault(
                "conditions",
                [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": self._ts(),
                        "lastTransitionTime": self._ts(),
                    }
                ],
            )

    def _prepare_pod(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        if old is not None:
            return
        name = obj["metadata"]["name"]
        spec = obj.get("spec")
        if not isinstance(spec, dict) or not spec.get("containers"):
            raise invalid(rt, name, "spec.containers", [], "Required value")
        for i, c in enumerate(spec["containers"] + (spec.get("initContainers") or [])):
            if not c.get("name"):
                raise invalid(rt, name, f"spec.containers[{i}].name", "", "Required value")
            if not c.get("image"):
                raise invalid(rt, name, f"spec.containers[{i}].image", "", "Required value")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault(
                "imagePullPolicy",
                "Always"
                if c["image"].endswith(":latest") or ":" not in c["image"]
                else "IfNotPresent",
            )
            res = c.setdefault("resources", {})
            for which in ("requests", "limits"):
                for k, v in (res.get(which) or {}).items():
                    try:
                        parse_quantity(v)
                    except ValueError as exc:
                        raise invalid(
                            rt, name, f"spec.containers[{i}].resources.{which}[{k}]", v, str(exc)
                        ) from exc
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("securityContext", {})
        self._resolve_priority(name, spec)
        obj["status"] = {"phase": "Pending", "qosClass": self._qos(spec)}

    @staticmethod
    def _qos(spec: dict) -> str:
        res = [c.get("resources") or {} for c in spec.get("containers") or []]
        if not any((r.get("requests") or r.get("limits")) for r in res):
            return "BestEffort"
        for r in res:
            lim, req = r.get("limits") or {}, r.get("requests") or {}
            for k in ("cpu", "memory"):
                if k not in lim or req.get(k, lim[k]) != lim[k]:
                    return "Burstable"
        return "Guaranteed"

    def _prepare_job(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        meta, name = obj["metadata"], obj["metadata"]["name"]
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            raise invalid(rt, name, "spec", None, "Required value")
        template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
        spec["template"] = template
        tspec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
        if old is None:
            if not tspec.get("containers"):
                raise invalid(rt, name, "spec.template.spec.containers", [], "Required value")
            if tspec.get("restartPolicy") not in ("OnFailure", "Never"):
                raise invalid(
                    rt,
                    name,
                    "spec.template.spec.restartPolicy",
                    tspec.get("restartPolicy") or "",
                    'Required value: valid values: "OnFailure", "Never"',
                )
            if spec.get("podFailurePolicy") and tspec.get("restartPolicy") != "Never":
                raise invalid(
                    rt,
                    name,
                    "spec.template.spec.restartPolicy",
                    tspec.get("restartPolicy"),
                    'only "Never" is supported when podFailurePolicy is specified',
                )
            spec.setdefault("completionMode", "NonIndexed")
            if spec["completionMode"] == "Indexed" and spec.get("completions") is None:
                raise invalid(rt, name, "spec.completions", None, "when completion mode is Indexed")
            if spec.get("parallelism") is None and spec.get("completions") is None:
                spec["completions"] = 1
            spec.setdefault("parallelism", 1)
            if spec.get("backoffLimitPerIndex") is None:
                spec.setdefault("backoffLimit", 6)
            spec.setdefault("suspend", False)
            spec.setdefault("manualSelector", None)
            if spec["manualSelector"] is None:
                spec.pop("manualSelector")
            spec.setdefault(
                "podReplacementPolicy",
                "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed",
            )
            uid = meta["uid"]
            ctl = {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            tmeta = template.get("metadata") if isinstance(template.get("metadata"), dict) else {}
            template["metadata"] = tmeta
            tmeta["labels"] = {**(tmeta.get("labels") or {}), **ctl}
            if not meta.get("labels"):
                meta["labels"] = dict(tmeta["labels"])
            return
        ospec = old.get("spec") or {}
        for f in ("selector", "completionMode", "podFailurePolicy"):
            if spec.get(f) != ospec.get(f):
                raise invalid(rt, name, f"spec.{f}", spec.get(f), "field is immutable")
        if spec.get("completions") != ospec.get("completions") and not (
            spec.get("completionMode") == "Indexed"
            and spec.get("completions") == spec.get("parallelism")
        ):
            raise invalid(
                rt, name, "spec.completions", spec.get("completions"), "field is immutable"
            )
        mutable = ("nodeSelector", "tolerations", "affinity", "schedulingGates")

        def strip(t: dict) -> dict:
            t = copy.deepcopy(t or {})
            (t.get("metadata") or {}).pop("labels", None)
            (t.get("metadata") or {}).pop("annotations", None)
            for k in mutable:
                (t.get("spec") or {}).pop(k, None)
            return t

        otmpl = ospec.get("template") or {}
        if strip(template) != strip(otmpl):
            raise invalid(rt, name, "spec.template", "...", "field is immutable")
        if template != otmpl:
            suspended_unstarted = ospec.get("suspend") and not (old.get("status") or {}).get(
                "startTime"
            )
            if not suspended_unstarted:
                raise invalid(
                    rt,
                    name,
                    "spec.template",
                    "...",
                    "field is immutable (scheduling directives may change only while the "
                    "Job is suspended and has not started)",
                )

    @staticmethod
    def _prepare_replicated(rt: ResourceType, obj: dict, old: dict | None) -> dict:
        """What Deployments and ReplicaSets share: ``replicas`` (default 1), a selector
        that selects the template's labels (422 otherwise) and can't change, and a
        template with containers. Returns the spec."""
        name = obj["metadata"]["name"]
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            raise invalid(rt, name, "spec", None, "Required value")
        spec.setdefault("replicas", 1)
        replicas = spec["replicas"]
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid(rt, name, "spec.replicas", replicas, "must be greater than or equal to 0")
        selector = spec.get("selector")
        if not isinstance(selector, dict) or not (
            selector.get("matchLabels") or selector.get("matchExpressions")
        ):
            raise invalid(rt, name, "spec.selector", selector, "Required value")
        if old is not None and selector != (old.get("spec") or {}).get("selector"):
            raise invalid(rt, name, "spec.selector", selector, "field is immutable")
        template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        if not all(p(labels) for p in label_selector_from_dict(selector)):
            raise invalid(
                rt, name, "spec.template.metadata.labels", labels,
                "`selector` does not match template `labels`",
            )  # fmt: skip
        if not (template.get("spec") or {}).get("containers"):
            raise invalid(rt, name, "spec.template.spec.containers", [], "Required value")
        template["spec"].setdefault("restartPolicy", "Always")
        if template["spec"]["restartPolicy"] != "Always":
            raise invalid(
                rt, name, "spec.template.spec.restartPolicy",
                template["spec"]["restartPolicy"], 'Unsupported value: supported values: "Always"',
            )  # fmt: skip
        spec.setdefault("minReadySeconds", 0)
        return spec

    def _prepare_deployment(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        spec = self._prepare_replicated(rt, obj, old)
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            for key, value in DEFAULT_ROLLING_UPDATE.items():
                rolling.setdefault(key, value)
        elif strategy["type"] != "Recreate":
            raise invalid(
                rt, obj["metadata"]["name"], "spec.strategy.type", strategy["type"],
                'Unsupported value: supported values: "Recreate", "RollingUpdate"',
            )  # fmt: skip
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)

    def _prepare_replicaset(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        self._prepare_replicated(rt, obj, old)
        if old is None:  # `replicas` is the one status field without omitempty
            obj["status"] = {"replicas": 0}

    def _prepare_horizontalpodautoscaler(
        self, rt: ResourceType, obj: dict, old: dict | None
    ) -> None:
        """autoscaling/v2 defaults: minReplicas 1 and, without metrics, 80 % CPU."""
        name = obj["metadata"]["name"]
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            raise invalid(rt, name, "spec", None, "Required value")
        target = spec.get("scaleTargetRef")
        if not isinstance(target, dict) or not target.get("kind") or not target.get("name"):
            raise invalid(rt, name, "spec.scaleTargetRef", target, "Required value")
        spec.setdefault("minReplicas", 1)
        low, high = spec["minReplicas"], spec.get("maxReplicas")
        if not isinstance(high, int) or high < 1:
            raise invalid(rt, name, "spec.maxReplicas", high, "must be greater than 0")
        if not isinstance(low, int) or not 1 <= low <= high:
            raise invalid(
                rt, name, "spec.minReplicas", low,
                "must be greater than 0 and less than or equal to maxReplicas",
            )  # fmt: skip
        if not spec.get("metrics"):
            spec["metrics"] = [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 80},
                    },
                }
            ]
        if old is None:  # `desiredReplicas` is the one status field without omitempty
            obj["status"] = {"desiredReplicas": 0}

    def _prepare_service(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for p in spec.get("ports") or []:
            p.setdefault("protocol", "TCP")
            if "port" in p:
                p.setdefault("targetPort", p["port"])
        ospec = (old or {}).get("spec") or {}
        if old is not None and ospec.get("clusterIP"):
            if spec.get("clusterIP") not in (None, "", ospec["clusterIP"]):
                raise invalid(
                    rt,
                    obj["metadata"]["name"],
                    "spec.clusterIP",
                    spec["clusterIP"],
                    "field is immutable",
                )
            spec["clusterIP"] = ospec["clusterIP"]
        elif not spec.get("clusterIP"):
            n = next(self._ips)
            spec["clusterIP"] = f"10.96.{n // 250 % 250}.{n % 250 + 1}"
        spec["clusterIPs"] = [spec["clusterIP"]]

    def _prepare_secret(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        obj.setdefault("type", "Opaque")
        sd = obj.pop("stringData", None)
        if sd:
            data = dict(obj.get("data") or {})
            for k, v in sd.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
            obj["data"] = data

    def _prepare_event(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        if old is None:
            obj.setdefault("count", 1)
            obj.setdefault("firstTimestamp", self._ts())
            obj.setdefault("lastTimestamp", obj["firstTimestamp"])
            obj.setdefault("type", "Normal")

    def _prepare_resourcequota(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        hard = (obj.get("spec") or {}).get("hard") or {}
        for k, v in hard.items():
            try:
                parse_quantity(v)
            except ValueError as exc:
                raise invalid(rt, obj["metadata"]["name"], f"spec.hard[{k}]", v, str(exc)) from exc
        ns = obj["metadata"]["namespace"]
        obj["status"] = {
            "hard": dict(hard),
            "used": {k: format_quantity(v) for k, v in self._quota_usage(ns, hard).items()},
        }

    # A claim is bound at once to a simulated volume of its size (as a dynamic
    # provisioner with Immediate binding would); the spec is immutable but for a larger
    # storage request (volume expansion).
    PVC_ACCESS_MODES = frozenset(
        {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}
    )

    def _prepare_persistentvolumeclaim(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        name = obj["metadata"]["name"]
        spec = obj.setdefault("spec", {})
        modes = spec.get("accessModes") or []
        if not modes or not set(modes) <= self.PVC_ACCESS_MODES:
            raise invalid(rt, name, "spec.accessModes", modes, "Unsupported value")
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
        try:
            size = parse_quantity(storage)
        except (TypeError, ValueError) as exc:
            raise invalid(
                rt, name, "spec.resources.requests.storage", storage, "Required value"
            ) from exc
        if old is not None:
            ospec = old.get("spec") or {}
            before = parse_quantity(ospec["resources"]["requests"]["storage"])
            if size < before:
                raise invalid(
                    rt, name, "spec.resources.requests.storage", storage,
                    "field can not be less than previous value",
                )  # fmt: skip
            if modes != ospec.get("accessModes"):
                raise invalid(rt, name, "spec", "", "spec is immutable after creation")
            spec["volumeName"] = ospec.get("volumeName")
            spec["storageClassName"] = ospec.get("storageClassName")
        else:
            spec.setdefault("storageClassName", "standard")
            spec["volumeName"] = f"pvc-{obj['metadata']['uid']}"
            spec.setdefault("volumeMode", "Filesystem")
        obj["status"] = {
            "phase": "Bound",
            "accessModes": list(modes),
            "capacity": {"storage": str(storage)},
        }
