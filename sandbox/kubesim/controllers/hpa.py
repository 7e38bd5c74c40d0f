"""The HorizontalPodAutoscaler controller (autoscaling/v2) for HPAs that scale a
Deployment: every ``hpa_sync_seconds`` (15, as the real controller's sync period) it
reads each metric over the target's ready pods (CPU use against the pods' CPU requests,
or GPU utilisation: the ``nvidia.com/gpu`` resource, or a Pods or External metric named
``gpu_utilization``), proposes ``ceil(ready pods × current / target)`` (no change
within a 10 % tolerance; the largest proposal of several metrics wins), stabilises it
over ``behavior`` windows (scale down: the highest proposal of the last 300 s; scale
up: the lowest of the last 0 s), bounds it by min/max replicas and sets the
Deployment's ``spec.replicas``. Metrics come from the serving pods' request counts over
the last ``metrics_window_seconds`` (controllers.serving), as metrics-server would
report them."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from sandbox.kubesim.conditions import TERMINAL_PHASES, is_true, set_condition
from sandbox.kubesim.controllers.serving import ServingKubelet
from sandbox.kubesim.resources import GPU_RESOURCES, ResourceType, parse_quantity
from sandbox.kubesim.selectors import label_selector_from_dict

SYNC_SECONDS = 15.0
METRICS_WINDOW_SECONDS = 15.0
TOLERANCE = 0.1
SCALE_DOWN_WINDOW_SECONDS = 300
GPU_METRIC = "gpu_utilization"


class MetricUnavailable(Exception):
    """A metric can't be read now; its message goes into the ScalingActive condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class _HpaBook:
    synced_at: float | None = None
    #: (when, proposal before stabilisation), newest last.
    proposals: list[tuple[float, int]] = field(default_factory=list)


def replicas_for(ratio: float, ready: int, unready: int, current: int) -> int:
    """The real HPA's proposal from the ratio of the ready pods' metric to its target:
    within the tolerance nothing changes; scaling up, unready pods count as idle, and a
    proposal that would then turn into a scale-down keeps the current count."""
    if abs(ratio - 1) <= TOLERANCE:
        return current
    if ratio > 1 and unready:
        ratio = ratio * ready / (ready + unready)
        if ratio <= 1 + TOLERANCE:
            return current
        return math.ceil(ratio * (ready + unready))
    return math.ceil(ratio * ready)


class HPAController(ServingKubelet):
    """One pass over every HorizontalPodAutoscaler whose sync is due."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hpa_books: dict[str, _HpaBook] = {}  # by HPA uid
        #: Seconds between two evaluations of one HPA.
        self.hpa_sync_seconds = SYNC_SECONDS
        #: Seconds over which pods' CPU and GPU use is averaged.
        self.metrics_window_seconds = METRICS_WINDOW_SECONDS

    def _forget(self, rt: ResourceType, obj: dict) -> None:
        super()._forget(rt, obj)
        if rt.key == "horizontalpodautoscalers.autoscaling":
            self._hpa_books.pop(obj["metadata"]["uid"], None)

    def _hpa_pass(self) -> None:
        now = self._now()
        for hpa in self._objects(self._by_key["horizontalpodautoscalers.autoscaling"]):
            book = self._hpa_books.setdefault(hpa["metadata"]["uid"], _HpaBook())
            if book.synced_at is not None and now < book.synced_at + self.hpa_sync_seconds:
                continue
            book.synced_at = now
            self._autoscale(hpa, book, now)

    def _autoscale(self, hpa: dict, book: _HpaBook, now: float) -> None:
        hrt, drt = (
            self._by_key["horizontalpodautoscalers.autoscaling"],
            self._by_key["deployments.apps"],
        )
        spec, ts = hpa["spec"], self._ts()
        status = copy.deepcopy(hpa.get("status") or {})
        conds = status.setdefault("conditions", [])
        ref = spec["scaleTargetRef"]
        target = self._get(drt, hpa["metadata"]["namespace"], ref["name"])
        if ref["kind"] != "Deployment" or target is None:
            set_condition(
                conds, "AbleToScale", "False", "FailedGetScale",
                f"the HPA controller was unable to get the target's current scale: "
                f'{ref["kind"].lower()}s "{ref["name"]}" not found', ts,
            )  # fmt: skip
            self._write_hpa_status(hpa, status)
            return
        current = target["spec"]["replicas"]
        status["currentReplicas"] = (target.get("status") or {}).get("replicas", 0)
        if current == 0:
            set_condition(
                conds, "ScalingActive", "False", "ScalingDisabled",
                "scaling is disabled since the replica count of the target is zero", ts,
            )  # fmt: skip
            status["desiredReplicas"] = 0
            self._write_hpa_status(hpa, status)
            return
        pods = self._target_pods(target)
        proposals, current_metrics = [], []
        failures: list[MetricUnavailable] = []
        for metric in spec["metrics"]:
            try:
                ratio, ready, unready, reading = self._metric_ratio(metric, pods)
            except MetricUnavailable as error:
                failures.append(error)
                continue
            proposals.append(replicas_for(ratio, ready, unready, current))
            current_metrics.append(reading)
        status["currentMetrics"] = current_metrics or None
        if not current_metrics:
            status.pop("currentMetrics")
        if not proposals:  # every metric failed (an HPA has at least one)
            failure = failures[0]
            set_condition(conds, "ScalingActive", "False", failure.reason, str(failure), ts)
            set_condition(
                conds, "AbleToScale", "True", "SucceededGetScale",
                "the HPA controller was able to get the target's current scale", ts,
            )  # fmt: skip
            status["desiredReplicas"] = current
            self._write_hpa_status(hpa, status)
            return
        set_condition(
            conds, "ScalingActive", "True", "ValidMetricFound",
            "the HPA was able to successfully calculate a replica count from "
            f"{_metric_name(spec['metrics'][0])}", ts,
        )  # fmt: skip
        proposal = max(proposals)
        desired = self._stabilized(spec, book, now, proposal, current)
        low, high = spec.get("minReplicas", 1), spec["maxReplicas"]
        if desired > high:
            desired = high
            set_condition(
                conds, "ScalingLimited", "True", "TooManyReplicas",
                "the desired replica count is more than the maximum replica count", ts,
            )  # fmt: skip
        elif desired < low:
            desired = low
            set_condition(
                conds, "ScalingLimited", "True", "TooFewReplicas",
                "the desired replica count is less than the minimum replica count", ts,
            )  # fmt: skip
        else:
            set_condition(
                conds, "ScalingLimited", "False", "DesiredWithinRange",
                "the desired count is within the acceptable range", ts,
            )  # fmt: skip
        status["desiredReplicas"] = desired
        if desired != current:
            scaled = copy.deepcopy(target)
            scaled["spec"]["replicas"] = desired
            self._update(drt, target, scaled)
            status["lastScaleTime"] = ts
            set_condition(
                conds, "AbleToScale", "True", "SucceededRescale",
                f"the HPA controller was able to update the target scale to {desired}", ts,
            )  # fmt: skip
            way = "above" if desired > current else "below"
            self._emit(
                hrt, hpa, "Normal", "SuccessfulRescale",
                f"New size: {desired}; reason: {_metric_name(spec['metrics'][0])} {way} target",
                "horizontal-pod-autoscaler",
            )  # fmt: skip
        else:
            set_condition(
                conds, "AbleToScale", "True", "ReadyForNewScale",
                "recommended size matches current size", ts,
            )  # fmt: skip
        self._write_hpa_status(hpa, status)

    @staticmethod
    def _stabilized(spec: dict, book: _HpaBook, now: float, proposal: int, current: int) -> int:
        """The real controller's stabilisation: not above the lowest proposal of the
        scale-up window, not below the highest of the scale-down window."""
        behavior = spec.get("behavior") or {}
        up = (behavior.get("scaleUp") or {}).get("stabilizationWindowSeconds", 0)
        down = (behavior.get("scaleDown") or {}).get(
            "stabilizationWindowSeconds", SCALE_DOWN_WINDOW_SECONDS
        )
        book.proposals = [(t, p) for t, p in book.proposals if t > now - max(up, down)]
        book.proposals.append((now, proposal))
        up_floor = min(p for t, p in book.proposals if t > now - up or t == now)
        down_ceiling = max(p for t, p in book.proposals if t > now - down or t == now)
        return min(max(current, up_floor), down_ceiling)

    def _target_pods(self, deployment: dict) -> list[dict]:
        preds = label_selector_from_dict(deployment["spec"]["selector"])
        return [
            p
            for p in self._objects(self._by_key["pods"], deployment["metadata"]["namespace"])
            if p["status"].get("phase") not in TERMINAL_PHASES
            and all(pred(p["metadata"].get("labels") or {}) for pred in preds)
        ]

    def _metric_ratio(self, metric: dict, pods: list[dict]) -> tuple[float, int, int, dict]:
        """(current ÷ target over the ready pods, ready pods measured, unready pods, the
        ``currentMetrics`` entry) of one metric spec."""
        kind = metric.get("type")
        source = metric.get({"Resource": "resource", "Pods": "pods", "External": "external"}.get(
            kind or "", ""
        )) or {}  # fmt: skip
        name = source.get("name") or (source.get("metric") or {}).get("name")
        target = source.get("target") or {}
        gpu = name in GPU_RESOURCES if kind == "Resource" else name == GPU_METRIC
        if not gpu and not (kind == "Resource" and name == "cpu"):
            raise MetricUnavailable(
                f"FailedGet{kind}Metric",
                f"unable to get metric {name}: no metrics returned from the metrics API",
            )
        ready = [p for p in pods if is_true(p, "Ready")]
        window = self.metrics_window_seconds
        usage = {p["metadata"]["uid"]: self.pod_usage(p["metadata"]["uid"], window) for p in ready}
        measured = [p for p in ready if usage[p["metadata"]["uid"]] is not None]
        if not measured:
            raise MetricUnavailable(
                f"FailedGet{kind}Metric",
                f"unable to get metric {name}: did not receive metrics for targeted pods "
                "(pods might be unready)",
            )
        unready = len(pods) - len(ready)
        if gpu:
            average = sum(usage[p["metadata"]["uid"]][1] for p in measured) / len(measured)
            return self._gpu_ratio(kind, name, target, average, len(measured), unready)
        used = sum(usage[p["metadata"]["uid"]][0] for p in measured)
        if target.get("type") == "AverageValue":
            wanted = float(parse_quantity(target["averageValue"])) * 1000
            reading = {"averageValue": f"{round(used / len(measured))}m"}
            return used / len(measured) / wanted, len(measured), unready, _resource(name, reading)
        requested = Fraction(0)
        for p in measured:
            cpu = self._pod_resources(p).get("cpu")
            if not cpu:
                raise MetricUnavailable(
                    "FailedGetResourceMetric",
                    f"failed to get cpu utilization: missing request for cpu in pod "
                    f"{p['metadata']['name']}",
                )
            requested += cpu
        utilization = 100 * used / float(requested * 1000)
        reading = {
            "averageUtilization": round(utilization),
            "averageValue": f"{round(used / len(measured))}m",
        }
        ratio = utilization / target.get("averageUtilization", 80)
        return ratio, len(measured), unready, _resource(name, reading)

    @staticmethod
    def _gpu_ratio(
        kind: str, name: str, target: dict, average: float, measured: int, unready: int
    ) -> tuple[float, int, int, dict]:
        """GPU utilisation (percent) against a Utilization, AverageValue or Value target."""
        value = str(round(average))
        if kind == "Resource":
            reading = _resource(name, {"averageUtilization": round(average), "averageValue": value})
            return average / target.get("averageUtilization", 80), measured, unready, reading
        which = "value" if target.get("type") == "Value" else "averageValue"
        wanted = float(parse_quantity(target.get(which, 80)))
        current = {"metric": {"name": name}, "current": {which: value}}
        return average / wanted, measured, unready, {"type": kind, kind.lower(): current}

    def _write_hpa_status(self, hpa: dict, status: dict) -> None:
        status["observedGeneration"] = hpa["metadata"].get("generation", 1)

        def write(o: dict) -> None:
            o["status"] = status

        self._modify(self._by_key["horizontalpodautoscalers.autoscaling"], hpa, write)


def _resource(name: str, current: dict) -> dict:
    return {"type": "Resource", "resource": {"name": name, "current": current}}


def _metric_name(metric: dict) -> str:
    """How the real controller names a metric in its messages."""
    if metric.get("type") == "Resource":
        name = (metric.get("resource") or {}).get("name")
        return f"{name} resource utilization (percentage of request)"
    source = metric.get((metric.get("type") or "").lower()) or {}
    return f"{(source.get('metric') or {}).get('name')} {(metric.get('type') or '').lower()} metric"
