"""Validation of names and labels, with the real API's 422 ``Invalid`` messages."""

from __future__ import annotations

import json
import re
from typing import Any

from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.resources import ResourceType

_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def invalid(rt: ResourceType, name: str, field_path: str, value: Any, msg: str) -> ApiError:
    shown = json.dumps(value) if not isinstance(value, str) else f'"{value}"'
    return ApiError(
        422,
        f'{rt.kind}{"." + rt.group if rt.group else ""} "{name}" is invalid: '
        f"{field_path}: Invalid value: {shown}: {msg}",
        details={**rt.details(name), "causes": [{"field": field_path, "message": msg}]},
    )


def validate_name(rt: ResourceType, name: str) -> None:
    if rt.plural in ("namespaces", "services"):
        regex, maxlen = (_LABEL_RE if rt.plural == "namespaces" else _DNS1035_RE), 63
        what = "a lowercase RFC 1123 label" if rt.plural == "namespaces" else "a DNS-1035 label"
    else:
        regex, maxlen = _SUBDOMAIN_RE, (63 if rt.plural == "jobs" else 253)
        what = "a lowercase RFC 1123 subdomain"
    if len(name) > maxlen:
        raise invalid(rt, name, "metadata.name", name, f"must be no more than {maxlen} characters")
    if not regex.match(name):
        raise invalid(
            rt,
            name,
            "metadata.name",
            name,
            f"{what} must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character",
        )


def validate_labels(rt: ResourceType, name: str, labels: Any) -> None:
    if labels is None:
        return
    if not isinstance(labels, dict):
        raise invalid(rt, name, "metadata.labels", labels, "must be a map")
    for k, v in labels.items():
        prefix, _, lname = k.rpartition("/")
        ok = (
            bool(_LABEL_NAME_RE.match(lname))
            and len(lname) <= 63
            and (not prefix or (len(prefix) <= 253 and _SUBDOMAIN_RE.match(prefix)))
        )
        if not ok:
            raise invalid(rt, name, "metadata.labels", k, "name part must be a valid label key")
        if not isinstance(v, str) or len(v) > 63 or (v and not _LABEL_NAME_RE.match(v)):
            raise invalid(
                rt,
                name,
                "metadata.labels",
                v,
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character "
                "(at most 63 characters)",
            )


# Where each kind keeps its pod spec (a template for the workloads).
_POD_SPEC_PATHS = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
}


def validate_ports(rt: ResourceType, name: str, obj: dict) -> None:
    """Container and Service ports within 1-65535, as the API server requires."""
    if rt.kind == "Service":
        for i, port in enumerate((obj.get("spec") or {}).get("ports") or []):
            _check_port(rt, name, f"spec.ports[{i}].port", port.get("port"))
        return
    path = _POD_SPEC_PATHS.get(rt.kind)
    if path is None:
        return
    spec: Any = obj
    for key in path:
        spec = (spec or {}).get(key) if isinstance(spec, dict) else None
    prefix = ".".join(path)
    for c, container in enumerate((spec or {}).get("containers") or []):
        for i, port in enumerate(container.get("ports") or []):
            field_path = f"{prefix}.containers[{c}].ports[{i}].containerPort"
            _check_port(rt, name, field_path, port.get("containerPort"))


def _check_port(rt: ResourceType, name: str, field_path: str, port: Any) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise invalid(rt, name, field_path, port, "must be between 1 and 65535, inclusive")
