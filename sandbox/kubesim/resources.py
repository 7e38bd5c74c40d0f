"""The resource types the simulator serves, and Kubernetes quantities ("500m", "80Gi")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910")


@dataclass(frozen=True)
class ResourceType:
    """One served resource: where it lives in the API and what its objects are called."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def details(self, name: str, uid: str | None = None) -> dict:
        d = {"name": name, "kind": self.plural}
        if self.group:
            d["group"] = self.group
        if uid:
            d["uid"] = uid
        return d

    def what(self, name: str) -> str:
        return f'{self.key} "{name}"'

    @property
    def scalable(self) -> bool:
        """Whether it has the ``scale`` subresource (an autoscaling/v1 Scale)."""
        return self.key in ("deployments.apps", "replicasets.apps")


BUILTIN_TYPES = (
    ResourceType("", "v1", "namespaces", "Namespace", False),
    ResourceType("", "v1", "nodes", "Node", False),
    ResourceType("", "v1", "pods", "Pod", True),
    ResourceType("", "v1", "services", "Service", True),
    ResourceType("", "v1", "secrets", "Secret", True, has_status=False),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, has_status=False),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, has_status=False),
    ResourceType("", "v1", "events", "Event", True, has_status=False),
    ResourceType("", "v1", "resourcequotas", "ResourceQuota", True),
    ResourceType("", "v1", "limitranges", "LimitRange", True, has_status=False),
    ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    ResourceType("", "v1", "endpoints", "Endpoints", True, has_status=False),
    ResourceType("apps", "v1", "deployments", "Deployment", True),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet", True),
    ResourceType("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True),
    ResourceType("batch", "v1", "jobs", "Job", True),
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, False),
    ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, False),
)

_QTY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$"
)
_SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}


def parse_quantity(value: Any) -> Fraction:
    """Parse a Kubernetes quantity ("500m", "1Ti", "8", 2) into a Fraction."""
    if isinstance(value, int | float):
        return Fraction(str(value))
    m = _QTY.match(str(value).strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression: {value!r}")
    num = Fraction(m.group(1))
    if m.group(2):
        num *= Fraction(10) ** int(m.group(2)[1:])
    elif m.group(3):
        num *= _SUFFIX[m.group(3)]
    return num


def format_quantity(q: Fraction) -> str:
    if q.denominator == 1:
        return str(q.numerator)
    milli = q * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return str(float(q))
