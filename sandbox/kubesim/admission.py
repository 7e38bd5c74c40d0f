"""Admission: ResourceQuota enforcement on create (403 ``exceeded quota``) and
LimitRange container defaults, plus the quota usage arithmetic they share."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

from sandbox.kubesim.conditions import TERMINAL_PHASES
from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.resources import ResourceType, format_quantity, parse_quantity
from sandbox.kubesim.store import Store


class Admission(Store):
    """Quota and limit-range admission of pods and other namespaced objects."""

    @staticmethod
    def _pod_resources(pod: dict, which: str = "requests") -> dict[str, Fraction]:
        def one(c: dict) -> dict[str, Fraction]:
            res = c.get("resources") or {}
            vals = dict(res.get("limits") or {}) if which == "requests" else {}
            vals.update(res.get(which) or {})
            return {k: parse_quantity(v) for k, v in vals.items()}

        spec = pod.get("spec") or {}
        total: Counter = Counter()
        for c in spec.get("containers") or []:
            total.update(one(c))
        for c in spec.get("initContainers") or []:
            for k, v in one(c).items():
                total[k] = max(total[k], v)
        return dict(total)

    def _quota_usage(
        self, ns: str, hard: dict, extra_pod: dict | None = None, extra_rt: str | None = None
    ) -> dict[str, Fraction]:
        pods = [
            p
            for p in self._objects(self._by_key["pods"], ns)
            if (p.get("status") or {}).get("phase") not in TERMINAL_PHASES
        ]
        if extra_pod is not None:
            pods.append(extra_pod)
        used: dict[str, Fraction] = {}
        for key in hard:
            if key == "pods":
                used[key] = Fraction(len(pods))
            elif key.startswith("limits."):
                res = key[len("limits.") :]
                used[key] = sum(
                    (self._pod_resources(p, "limits").get(res, 0) for p in pods), Fraction(0)
                )
            elif key.startswith("requests.") or key in ("cpu", "memory", "ephemeral-storage"):
                res = key.removeprefix("requests.")
                used[key] = sum((self._pod_resources(p).get(res, 0) for p in pods), Fraction(0))
            else:
                rkey = key.removeprefix("count/")
                try:
                    t = self._rt(rkey)
                except KeyError:
                    used[key] = Fraction(0)
                    continue
                n = len(self._objects(t, ns)) + (1 if extra_rt == t.key else 0)
                used[key] = Fraction(n)
        return used

    def _admit(self, rt: ResourceType, obj: dict) -> None:
        ns = obj["metadata"].get("namespace")
        if not ns:
            return
        name = obj["metadata"]["name"]
        if rt.plural == "pods":
            self._apply_limit_ranges(obj)
        for q in self._objects(self._by_key["resourcequotas"], ns):
            hard = (q.get("spec") or {}).get("hard") or {}
            if not hard:
                continue
            qname = q["metadata"]["name"]
            if rt.plural == "pods":
                need = [
                    k
                    for k in hard
                    if k in ("cpu", "memory", "requests.cpu", "requests.memory")
                    or k in ("limits.cpu", "limits.memory")
                ]
                missing = []
                for k in need:
                    which = "limits" if k.startswith("limits.") else "requests"
                    res = k.split(".")[-1]
                    for c in obj["spec"]["containers"]:
                        r = c.get("resources") or {}
                        vals = dict(r.get("limits") or {}) if which == "requests" else {}
                        vals.update(r.get(which) or {})
                        if res not in vals:
                            missing.append(k)
                            break
                if missing:
                    raise ApiError(
                        403,
                        f'pods "{name}" is forbidden: failed quota: {qname}: must specify '
                        + ",".join(sorted(missing)),
                        details={"name": name, "kind": "pods"},
                    )
                before = self._quota_usage(ns, hard)
                after = self._quota_usage(ns, hard, extra_pod=obj)
            else:
                before = self._quota_usage(ns, hard)
                after = self._quota_usage(ns, hard, extra_rt=rt.key)
            over = [k for k in hard if after[k] > before[k] and after[k] > parse_quantity(hard[k])]
            if over:
                req = ",".join(f"{k}={format_quantity(after[k] - before[k])}" for k in over)
                use = ",".join(f"{k}={format_quantity(before[k])}" for k in over)
                lim = ",".join(f"{k}={hard[k]}" for k in over)
                raise ApiError(
                    403,
                    f"{rt.what(name)} is forbidden: exceeded quota: {qname}, "
                    f"requested: {req}, used: {use}, limited: {lim}",
                    details=rt.details(name),
                )

    def _apply_limit_ranges(self, pod: dict) -> None:
        ns = pod["metadata"]["namespace"]
        for lr in self._objects(self._by_key["limitranges"], ns):
            for item in (lr.get("spec") or {}).get("limits") or []:
                if item.get("type") != "Container":
                    continue
                for c in pod["spec"]["containers"] + (pod["spec"].get("initContainers") or []):
                    res = c.setdefault("resources", {})
                    if item.get("default"):
                        lim = res.setdefault("limits", {})
                        for k, v in item["default"].items():
                            lim.setdefault(k, v)
                    if item.get("defaultRequest"):
                        req = res.setdefault("requests", {})
                        for k, v in item["defaultRequest"].items():
                            req.setdefault(k, v)
                    for k, v in (res.get("limits") or {}).items():
                        res.setdefault("requests", {}).setdefault(k, v)
